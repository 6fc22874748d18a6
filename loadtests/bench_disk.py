"""Chunked segment allocation: what it costs appends, and what it saves on disk.

    .venv/bin/python loadtests/bench_disk.py [--rounds 3] [--mib 192]

Anchor: segments allocated whole at creation (``segment_chunk_bytes =
segment_bytes``, how every segment was made before chunks); case: the
default 4 MiB chunks.  Each run appends ``--mib`` MiB of 100-byte entries
through the Python API (one entry per call, and 100 per call) on a fresh data
directory with a retention budget, so segments rotate and are deleted as in a
long run; anchor and case alternate within each round.  Also: the disk a new
16-shard stream with one event per shard takes (du) under both.  Prints a
table and the JSON written to ``loadtests/results/disk.json``.  Target (issue
"Bounded disk"): appends within 5 % of the anchor; at most 16 MiB on disk.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

import benchlib

from storage_c import Config, Log

LOADTESTS = Path(__file__).resolve().parent
REPO = LOADTESTS.parent
SCRATCH = LOADTESTS / ".scratch" / "disk"
RESULTS = LOADTESTS / "results" / "disk.json"
MiB = 1 << 20
SEGMENT = 16 * MiB
SETUPS = {"whole": SEGMENT, "chunked": 4 * MiB}  # segment_chunk_bytes
ENTRY = b'{"n":000000,"pad":"' + b"x" * 79 + b'"}'  # 100 bytes


def config(chunk: int) -> Config:
    return Config(shards=1, segment_bytes=SEGMENT, segment_chunk_bytes=chunk,
                  retention_max_total_bytes=8 * SEGMENT, retention_protect_unconsumed=False,
                  retention_interval_ms=0, background_flush=False)


def ns_per_entry(chunk: int, batch: int, mib: int) -> float:
    path = benchlib.fresh_dir(SCRATCH / "run")
    calls = mib * MiB // (len(ENTRY) * batch)
    payloads = [ENTRY] * batch
    with Log(path, config(chunk)) as log:
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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mib", type=int, default=192, help="MiB appended per run")
    args = parser.parse_args()
    runs: dict[str, list[float]] = {f"{s}_{b}": [] for b in (1, 100) for s in SETUPS}
    benchlib.warm_page_allocator(SCRATCH)
    for _ in range(args.rounds):
        for batch in (1, 100):
            for setup, chunk in SETUPS.items():
                runs[f"{setup}_{batch}"].append(ns_per_entry(chunk, batch, args.mib))
    med = {k: benchlib.median(v) for k, v in runs.items()}
    disk = {s: disk_of_new_stream(c) for s, c in SETUPS.items()}
    rows, table = [], []
    for batch in (1, 100):
        anchor, case = med[f"whole_{batch}"], med[f"chunked_{batch}"]
        ratio = anchor / case  # throughput terms: > 1 is faster than the anchor
        passed = ratio >= 0.95
        name = f"append, {batch} entr{'y' if batch == 1 else 'ies'} per call"
        table.append([f"Anchor: whole segments, {name}", f"{anchor:.1f} ns/entry", "—", "—", "—",
                      ", ".join(f"{x:.1f}" for x in runs[f"whole_{batch}"])])
        table.append([f"Chunked (4 MiB), {name}", f"{case:.1f} ns/entry", "≥ 0.95× anchor",
                      "PASS" if passed else "FAIL", f"{ratio:.3f}×",
                      ", ".join(f"{x:.1f}" for x in runs[f"chunked_{batch}"])])
        rows.append(benchlib.result_row(
            f"Chunked segments, {name}", f"chunked_{batch}", case, "ns/entry", f"{case:.1f} ns",
            anchor=benchlib.anchor_ref(f"whole_{batch}", f"whole segments, {name}", anchor,
                                       "ns/entry", f"{anchor:.1f} ns"),
            ratio=ratio, ratio_text=f"{ratio:.3f}×",
            target={"op": ">=", "value": 0.95, "unit": "x"}, target_text="≥ 0.95× anchor",
            passed=passed))
    for setup in SETUPS:
        table.append([f"Disk of a new 16-shard stream, 1 event per shard ({setup})",
                      f"{disk[setup] / MiB:.1f} MiB", "≤ 16 MiB" if setup == "chunked" else "—",
                      ("PASS" if disk[setup] <= 16 * MiB else "FAIL") if setup == "chunked" else "—",
                      "—", "—"])
    rows.append(benchlib.result_row(
        "Disk of a new 16-shard stream with 1 event per shard", "disk_new_stream",
        disk["chunked"] / MiB, "MiB", f"{disk['chunked'] / MiB:.1f} MiB",
        target={"op": "<=", "value": 16, "unit": "MiB"}, target_text="≤ 16 MiB",
        passed=disk["chunked"] <= 16 * MiB))
    print(benchlib.markdown_table(["Case", "Measured (median)", "Target", "Pass", "vs anchor", "Runs"],
                                  table))
    result = {"benchmark": "disk", "command": "python loadtests/bench_disk.py",
              "rounds": args.rounds, "mib_per_run": args.mib,
              "machine": benchlib.machine_info(SCRATCH),
              "source": benchlib.source_state(REPO, ["storage_c/src"]),
              "runs_ns_per_entry": runs, "disk_bytes": disk, "rows": rows}
    benchlib.write_json(RESULTS, result)
    print(json.dumps({"rows": rows}, ensure_ascii=False))


if __name__ == "__main__":
    main()
