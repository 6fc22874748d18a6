"""Chunked segment allocation against whole segments (the anchor): append cost (target
within 5 %) and the disk a new 16-shard stream takes (≤ 16 MiB).

    .venv/bin/python -m loadtests.bench_disk [--quick] [--rounds 3] [--mib 192]
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run by its path: again as a module
    from by_path import rerun_as_module  # type: ignore[import-not-found]

    rerun_as_module(__file__)

import os
import shutil
import time
from pathlib import Path

from loadtests import benchlib
from storage_c import Config, Log

SCRATCH = Path(__file__).resolve().parent / ".scratch" / "disk"
MiB = 1 << 20
SEGMENT = 16 * MiB
SETUPS = {"whole": SEGMENT, "chunked": 4 * MiB}  # segment_chunk_bytes
ENTRY = b'{"n":000000,"pad":"' + b"x" * 79 + b'"}'  # 100 bytes


def ns_per_entry(chunk: int, batch: int, mib: int) -> float:
    path = benchlib.fresh_dir(SCRATCH / "run")
    calls = mib * MiB // (len(ENTRY) * batch)
    payloads = [ENTRY] * batch
    with Log(path, Config(shards=1, segment_bytes=SEGMENT, segment_chunk_bytes=chunk,
                          retention_max_total_bytes=8 * SEGMENT, retention_protect_unconsumed=False,
                          retention_interval_ms=0, background_flush=False)) as log:
        append, append_batch = log.append, log.append_batch
        t0 = time.perf_counter()
        if batch == 1:
            for _ in range(calls):
                append("s", ENTRY, shard=0)
        else:
            for _ in range(calls):
                append_batch("s", payloads, shard=0)
        seconds = time.perf_counter() - t0
    shutil.rmtree(path, ignore_errors=True)
    return seconds / (calls * batch) * 1e9


def disk_of_new_stream(chunk: int) -> int:
    path = benchlib.fresh_dir(SCRATCH / "du")
    with Log(path, Config(shards=16, segment_bytes=SEGMENT, segment_chunk_bytes=chunk,
                          background_flush=False)) as log:
        for shard in range(16):
            log.append("s", b'{"a":1}', shard=shard)
    used = sum(os.lstat(os.path.join(r, n)).st_blocks * 512
               for r, ds, fs in os.walk(path) for n in ds + fs)
    shutil.rmtree(path, ignore_errors=True)
    return used


def main() -> None:
    parser = benchlib.parser(__doc__, "1 round of 32 MiB")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mib", type=int, default=192, help="MiB appended per run")
    args = parser.parse_args()
    rounds, mib = (1, 32) if args.quick else (args.rounds, args.mib)
    ctx = benchlib.Context("bench_disk", SCRATCH, ["storage_c/src"])
    series = {f"{s}_{b}": benchlib.Series(f"{s}_{b}", "ns/entry") for b in (1, 100) for s in SETUPS}
    benchlib.warm_page_allocator(SCRATCH)
    for _ in range(rounds):
        for batch in (1, 100):
            for setup, chunk in SETUPS.items():
                series[f"{setup}_{batch}"].runs.append(ns_per_entry(chunk, batch, mib))
    disk = {s: disk_of_new_stream(c) for s, c in SETUPS.items()}
    rows = []
    for batch in (1, 100):
        anchor, case = series[f"whole_{batch}"], series[f"chunked_{batch}"]
        name = f"append, {batch} entr{'y' if batch == 1 else 'ies'} per call"
        rows += [benchlib.series_row(f"Anchor: whole segments, {name}", anchor),
                 benchlib.series_row(f"Chunked segments (4 MiB), {name}", case, anchor,
                                     f"whole segments, {name}", (">=", 0.95), "≥ 0.95× anchor",
                                     target_unit="x")]
    rows.append(benchlib.row(
        "Anchor: disk of a new 16-shard stream, 1 event per shard (whole segments)",
        "disk_new_stream_whole", disk["whole"] / MiB, "MiB", f"{disk['whole'] / MiB:.1f} MiB",
        role="anchor"))
    rows.append(benchlib.row(
        "Disk of a new 16-shard stream with 1 event per shard", "disk_new_stream",
        disk["chunked"] / MiB, "MiB", f"{disk['chunked'] / MiB:.1f} MiB",
        anchor=benchlib.anchor_ref("disk_new_stream_whole", "whole segments", disk["whole"] / MiB,
                                   "MiB", f"{disk['whole'] / MiB:.1f} MiB"),
        target={"op": "<=", "value": 16, "unit": "MiB"}, target_text="≤ 16 MiB"))
    ctx.write(args, "disk", "Chunked segments", rows, [
        f"- {rounds} round(s) of {mib} MiB per run; the ratio is the anchor's ns/entry ÷ the "
        "case's (> 1: faster than whole segments)."],
        {"scale": {"runs": rounds, "mib_per_run": mib}, "disk_bytes": disk,
         "series": {k: v.to_json() for k, v in series.items()}})


if __name__ == "__main__":
    main()
