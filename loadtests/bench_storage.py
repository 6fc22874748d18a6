"""Storage benchmark at sustained volume: ns per entry of Log.append (1 entry) and
Log.append_batch (10, 100, 1000 entries) when each case writes min(2 GiB, 10x the page cache's
dirty limit) to a fresh data directory whose retention deletes old segments meanwhile, next to
the Go Comet figures, the warm-page floor (memcpy into a pre-faulted mapping) and a buffered
file write of the same bytes, all in the same run (rounds interleaved, medians reported).

    .venv/bin/python -m loadtests.bench_storage [--quick | --gb GB] [--rounds N] [--results DIR]
    # default: the full volume, 3 rounds (~1.5 min here); --quick: 128 MiB per case
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run by its path: again as a module
    from by_path import rerun_as_module  # type: ignore[import-not-found]

    rerun_as_module(__file__)

import gc
import json
import math
import mmap
import re
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator

from loadtests import benchlib
from storage_c import Config, Log

LOADTESTS = Path(__file__).resolve().parent
SCRATCH = LOADTESTS / ".scratch" / "storage"
MiB, GiB = 1 << 20, 1 << 30
FULL_BYTES, QUICK_BYTES, WARMUP_SHARE = 2 * GiB, 128 * MiB, 1 / 16
MAP_BYTES, FILE_BUFFER, CFFI_CALLS = 64 * MiB, 64 << 10, 1_000_000
STREAM, FIRST_TS_MS, BATCHES = "bench", 1_700_000_000_123, (1, 10, 100, 1000)
# Go Comet's own write benchmarks (issue 14: Go 1.23, this machine, 0.4-3 GB per run), ns/call,
# its mean payload sizes, and the targets: at least 1.5x faster (as the issue states them).
GO_NS_PER_CALL = {1: 720, 10: 1_692, 100: 18_698, 1000: 168_267}
PAYLOAD_BYTES = {1: 116, 10: 88, 100: 98, 1000: 110}
TARGET_NS_PER_CALL = {1: 480, 10: 1_130, 100: 12_500, 1000: 112_000}
FLOOR_TARGET = 3.0   # Comet ÷ warm-page floor at 1000 entries, at most
# retention of each Comet case, deleting segments while it runs: label, Config fields for the
# volume of one case (it keeps 1/8 of the volume, at least two 16 MiB segments)
RETENTION: dict[str, tuple[str, Callable[[int], dict[str, int]]]] = {
    "shard": ("retention by size per shard",
              lambda volume: {"retention_max_shard_bytes": max(32 * MiB, volume // 8)}),
    "budget": ("directory byte budget",
               lambda volume: {"retention_max_total_bytes": max(32 * MiB, volume // 8)}),
}
# Comet cases: key, entries per call, retention
COMET_CASES = (*((f"comet_{n}", n, "shard") for n in BATCHES), ("comet_1000_budget", 1000, "budget"))


def payload(i: int, size: int) -> bytes:
    """A JSON log line of exactly ``size`` bytes."""
    head = b'{"ts":%d,"seq":%d,"level":"info","svc":"edge-gw","msg":"' % (FIRST_TS_MS + i, i)
    return head + (b"request served " * 16)[:size - len(head) - 2] + b'"}'


def payloads(n: int) -> list[bytes]:
    """Go Comet's sizes: 116 B, 10 x 88 B, 100 x ~98 B and 1000 x ~110 B (mean +-4 B)."""
    return [payload(i, PAYLOAD_BYTES[n] + (i % 9 - 4 if n >= 100 else 0)) for i in range(n)]


@dataclass(frozen=True)
class Batch:
    n: int
    payloads: list[bytes]
    framed: bytes   # what one call stores: a header of the stored size carrying the length + payload
    calls: int      # calls per case: the case's volume of stored bytes

    def scaled(self, share: float) -> Batch:
        return Batch(self.n, self.payloads, self.framed, max(1, int(self.calls * share)))


def header_bytes() -> int:
    """Stored bytes per entry beyond its payload, as the core reports them (20 in format 1)."""
    with fresh_dir("probe") as run_dir, Log(run_dir / "data", Config.writer(shards=1)) as log:
        log.append_batch(STREAM, [b"x" * 100] * 10, shard=0)
        stats = log.shard_stats(STREAM, 0)
        return (stats.appended_stored_bytes - stats.appended_raw_bytes) // 10


def make_batches(volume: int, header: int) -> dict[int, Batch]:
    out = {}
    for n in BATCHES:
        ps = payloads(n)
        framed = b"".join(len(p).to_bytes(header, "little") + p for p in ps)
        out[n] = Batch(n, ps, framed, math.ceil(volume / len(framed)))
    return out


def dirty_limit() -> tuple[int, str]:
    """The page cache's dirty limit: vm.dirty_bytes, or vm.dirty_ratio % of MemAvailable."""
    vm = Path("/proc/sys/vm")
    if (dirty := int((vm / "dirty_bytes").read_text())) > 0:
        return dirty, f"vm.dirty_bytes {dirty / GiB:.2f} GiB"
    ratio = int((vm / "dirty_ratio").read_text())
    avail = next(int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                 if line.startswith("MemAvailable:"))
    return avail * ratio // 100, f"vm.dirty_ratio {ratio}% of MemAvailable {avail / GiB:.1f} GiB"


@contextmanager
def fresh_dir(name: str) -> Iterator[Path]:
    """A fresh directory under SCRATCH, removed on exit."""
    path = benchlib.fresh_dir(SCRATCH / name)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def time_comet(b: Batch, retention: dict[str, int]) -> tuple[float, dict[str, int]]:
    """``calls`` appends to one shard of a fresh directory, close() inside the timing;
    seconds and the shard's counters (retention must have deleted segments)."""
    with fresh_dir("comet") as run_dir:
        log = Log(run_dir / "data", Config.writer(shards=1, **retention))
        try:
            log.create_stream(STREAM, 1)
            fn: Callable[..., object] = log.append if b.n == 1 else log.append_batch
            arg: object = b.payloads[0] if b.n == 1 else b.payloads
            stream, calls = STREAM, b.calls
            gc.collect()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn(stream, arg, shard=0)
            t1 = time.perf_counter()
            s = log.shard_stats(STREAM, 0)
            t2 = time.perf_counter()
            log.close()
            dt = time.perf_counter() - t2 + t1 - t0
        finally:
            log.close()
    if s.next_entry != calls * b.n:
        raise RuntimeError(f"the shard holds {s.next_entry} entries, expected {calls * b.n}")
    return dt, {"stored_bytes": s.appended_stored_bytes, "rotations": s.rotations,
                "deleted_segments": s.retention_deleted_segments, "disk_bytes_at_end": s.disk_bytes,
                **{k: v for k, v in vars(s).items() if "recycl" in k}}  # when the core counts them


def time_floor(b: Batch, mm: mmap.mmap) -> float:
    """The warm-page floor: the call's stored bytes copied into a pre-faulted mapping, round-robin."""
    data, size, limit, pos = b.framed, len(b.framed), len(mm) - len(b.framed), 0
    gc.collect()
    t0 = time.perf_counter()
    for _ in range(b.calls):
        if pos > limit:
            pos = 0
        mm[pos:pos + size] = data
        pos += size
    return time.perf_counter() - t0


def time_file(b: Batch) -> float:
    """The same bytes to a file of a fresh directory: one f.write per call through a 64 KiB
    buffer (Go Comet's buffer size), close() inside the timing."""
    with fresh_dir("file") as run_dir:
        f = open(run_dir / "anchor.log", "wb", buffering=FILE_BUFFER)
        write, data = f.write, b.framed
        gc.collect()
        t0 = time.perf_counter()
        for _ in range(b.calls):
            write(data)
        f.close()
        return time.perf_counter() - t0


def cffi_floor(b: Batch) -> float:
    """``b.calls`` cffi calls of a C function doing no work (CRC32C of 0 bytes, 4 arguments).
    storage_c has no public call that does nothing, hence the private module."""
    from storage_c._comet import lib

    crc, empty = lib.comet_crc32c, b""
    gc.collect()
    t0 = time.perf_counter()
    for _ in range(b.calls):
        crc(0, empty, 0, 0)
    return time.perf_counter() - t0


def run_rounds(ctx: benchlib.Context, batches: dict[int, Batch], volume: int, rounds: int,
               probes: dict[str, dict[str, Any]], counters: dict[str, list[dict[str, int]]]
               ) -> dict[str, benchlib.Series]:
    """A warm-up round at WARMUP_SHARE of the volume, then ``rounds`` rounds of every case
    in turn: ns per call.  ``probes``: each case's busiest CPU probe; ``counters``: the
    Comet cases' shard counters, by round."""
    mm = mmap.mmap(-1, MAP_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_POPULATE)
    mm.write(b"\x01" * MAP_BYTES)   # every page touched too, not only populated

    def comet(b: Batch, key: str, retention: dict[str, int]) -> float:
        dt, info = time_comet(b, retention)
        counters.setdefault(key, []).append(info)
        return dt
    # key, entries per call, seconds for the Batch's calls
    cases: list[tuple[str, int, Callable[[Batch], float]]] = []
    for key, n, retention in COMET_CASES:
        cases.append((key, n, partial(comet, key=key, retention=RETENTION[retention][1](volume))))
        if retention == "shard":
            cases += [(f"floor_{n}", n, partial(time_floor, mm=mm)), (f"file_{n}", n, time_file)]
    cases.append(("cffi_floor", 0, cffi_floor))
    by_n = {0: Batch(1, [], b"", CFFI_CALLS), **batches}

    def one_round(i: int) -> dict[str, float]:
        out = {}
        for key, n, fn in cases:
            ctx.progress(f"round {'warm-up' if i < 0 else i + 1}: {key} ...")
            b = by_n[n].scaled(WARMUP_SHARE) if i < 0 else by_n[n]
            probe = benchlib.CpuProbe.start()
            out[key] = fn(b) / b.calls * 1e9
            p = probe.stop()
            if i >= 0 and p["other_share"] >= probes.get(key, {"other_share": -1.0})["other_share"]:
                probes[key] = p
        if i < 0:
            counters.clear()
        return out
    try:
        return benchlib.repeat_many({key: "ns/call" for key, _, _ in cases}, rounds, one_round)
    finally:
        mm.close()


def core_writer() -> dict[str, dict[str, Any]]:
    """loadtests/c/bench_entries.c's 1000-entry cases: the core's entry writer (header, copy
    and CRC32C of every entry) into a warm mapping, next to one memcpy of the joined bytes, in C:
    the CPU work of an append that no choice about pages removes."""
    with tempfile.TemporaryDirectory() as tmp:
        binary = benchlib.build_c(LOADTESTS / "c" / "bench_entries.c", Path(tmp) / "bench_entries")
        out = subprocess.run([str(binary), "3", "512"], check=True, capture_output=True,
                             text=True, timeout=600).stdout
    cases = (json.loads(line) for line in out.splitlines() if line.startswith("{"))
    return {c["case"]: c for c in cases if c["entries"] == 1000}


def per_entry(s: benchlib.Series, n: int) -> str:
    return f"{s.median:,.0f} ns/call = {s.median / n:,.1f} ns/entry"


def build_rows(series: dict[str, benchlib.Series],
               writer: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """A row per Comet case (against Go Comet, its target PASS or MISS), Comet ÷ floor at 1000
    entries, the core's writer alone (bench_entries.c), then the anchors of the same run."""
    rows = []
    for key, n, retention in COMET_CASES:
        s, go, target = series[key], GO_NS_PER_CALL[n], TARGET_NS_PER_CALL[n]
        floor_e, file_e = series[f"floor_{n}"].median / n, series[f"file_{n}"].median / n
        what = "append of 1" if n == 1 else f"append_batch of {n}"
        rows.append(benchlib.row(
            f"Comet: {what} × {'~' * (n >= 100)}{PAYLOAD_BYTES[n]} B, {RETENTION[retention][0]}",
            key, s.median, "ns/call", per_entry(s, n),
            anchor=benchlib.anchor_ref(None, "Go Comet, quoted", go, "ns/call"), ratio=go / s.median,
            ratio_text=f"Go/ours {go / s.median:.2f}×",
            target={"op": "<=", "value": target, "unit": "ns/call"},
            target_text=f"≤ {target:,} ns/call", passed=s.median <= target,
            verdict="PASS" if s.median <= target else "MISS",
            reference=f"same run: floor {floor_e:,.1f}, buffered file {file_e:,.1f} ns/entry",
            runs_text=benchlib.runs_text(s)))
    ours, floor = series["comet_1000"], series["floor_1000"]
    ratio = ours.median / floor.median
    rows.append(benchlib.row(
        "Comet ÷ warm-page floor, 1000 entries", "comet_floor_ratio_1000", ratio, "x",
        anchor=benchlib.anchor_ref(floor.name, "warm-page floor", floor.median, "ns/call"),
        target={"op": "<=", "value": FLOOR_TARGET, "unit": "x"},
        target_text=f"≤ {FLOOR_TARGET:.0f}×", passed=ratio <= FLOOR_TARGET,
        verdict="PASS" if ratio <= FLOOR_TARGET else "MISS",
        runs_text=", ".join(f"{a / b:.2f}" for a, b in zip(ours.runs, floor.runs)) + " ×"))
    entries, c_floor = writer["entries"], writer["floor"]
    rows.append(benchlib.row(
        "Reference: the core's entry writer alone (C, warm mapping, no page cache), 1000 per call",
        "core_writer_1000", entries["ns_per_call"], "ns/call", role="anchor",
        anchor=benchlib.anchor_ref(None, "one memcpy of the joined bytes (C)", c_floor["ns_per_call"],
                                   "ns/call"),
        ratio=1 / entries["ratio_to_floor"], ratio_text=f"{entries['ratio_to_floor']:.2f}× the C floor's time",
        reference="loadtests/c/bench_entries.c, median of 3 rounds",
        runs_text=f"{entries['min']:,.0f}-{entries['max']:,.0f} ns/call"))
    for prefix, name in (("floor", "warm-page floor (memcpy into a pre-faulted mapping)"),
                         ("file", "buffered file write of the same bytes")):
        rows += [benchlib.row(f"Anchor: {name}, {n} per call", f"{prefix}_{n}", s.median, "ns/call",
                              per_entry(s, n), role="anchor", runs_text=benchlib.runs_text(s))
                 for n in BATCHES for s in [series[f"{prefix}_{n}"]]]
    s = series["cffi_floor"]
    rows.append(benchlib.row("Anchor: cffi call doing no work (4 args)", s.name, s.median, "ns/call",
                             role="anchor", runs_text=benchlib.runs_text(s)))
    return rows


def entry_table(series: dict[str, benchlib.Series]) -> str:
    """ns per entry by batch size: Comet, Go Comet, the floor, the file, and their ratios."""
    def line(label: str, values: dict[int, float], fmt: str = "{:,.1f}") -> list[str]:
        return [label, *(fmt.format(values[n]) if n in values else "—" for n in BATCHES)]
    # keys: <kind>_<entries per call>[_<retention>]
    med = {k: s.median / int(k.split("_")[1]) for k, s in series.items() if k != "cffi_floor"}
    ours, floor, file = ({n: med[f"{p}_{n}"] for n in BATCHES} for p in ("comet", "floor", "file"))
    go = {n: v / n for n, v in GO_NS_PER_CALL.items()}
    rows = [line(f"Comet, {RETENTION['shard'][0]}", ours),
            *(line(f"Comet, {RETENTION[r][0]}", {1000: med[k]}) for k, _, r in COMET_CASES[4:]),
            line("Go Comet (quoted, issue 14)", go), line("Warm-page floor", floor),
            line("Buffered file write", file),
            line("Go ÷ Comet", {n: go[n] / ours[n] for n in BATCHES}, "{:.2f}×"),
            line("Comet ÷ floor", {n: ours[n] / floor[n] for n in BATCHES}, "{:.2f}×"),
            line("Comet ÷ buffered file", {n: ours[n] / file[n] for n in BATCHES}, "{:.2f}×")]
    return benchlib.markdown_table(["ns per entry (median)", *(f"{n} per call" for n in BATCHES)],
                                   rows)


def batch_sweep(series: dict[str, benchlib.Series]) -> dict[str, Any]:
    """storage.json's ``batch_sweep`` (report.py's chart): entries/s of every line by batch size."""
    def point(key: str, n: int) -> dict[str, Any]:
        rates = [n * 1e9 / v for v in series[key].runs]
        return {"batch": n, "entries_per_s": benchlib.median(rates), "runs": rates, "source": key}
    lines = [{"key": key, "label": label, "kind": kind,
              "points": [point(f"{prefix}_{n}", n) for n in BATCHES]}
             for key, prefix, label, kind in (
                 ("py_append_batch", "comet", "Comet: Log.append (1), append_batch (10-1000)", "comet"),
                 ("floor", "floor", "Warm-page floor: memcpy into a pre-faulted mapping", "anchor"),
                 ("file", "file", "Anchor: buffered file write of the same bytes", "anchor"))]
    extra = [{"key": key, "label": f"Comet, {RETENTION[r][0]}", "kind": "comet",
              "points": [point(key, n)]} for key, n, r in COMET_CASES[4:]]
    return {"unit": "entries/s", "batch_sizes": list(BATCHES), "lines": lines,
            "extra_points": extra, "go_reference_ns_per_call": {
                str(n): [v, v] for n, v in GO_NS_PER_CALL.items()}}


def main(argv: list[str] | None = None) -> int:
    p = benchlib.parser(__doc__, f"{QUICK_BYTES // MiB} MiB per case instead of the full volume")
    p.add_argument("--gb", type=float, help="GiB per case (default: min(2, 10x the dirty limit))")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    args = p.parse_args(argv)
    dirty, dirty_text = dirty_limit()
    volume = (int(args.gb * GiB) if args.gb else QUICK_BYTES if args.quick
              else min(FULL_BYTES, 10 * dirty))
    ctx = benchlib.Context("bench_storage", SCRATCH, ["storage_c"])
    probes: dict[str, dict[str, Any]] = {}
    counters: dict[str, list[dict[str, int]]] = {}
    try:
        header = header_bytes()
        batches = make_batches(volume, header)
        ctx.progress(f"{volume / GiB:.2f} GiB per case, {args.rounds} rounds")
        series = run_rounds(ctx, batches, volume, args.rounds, probes, counters)
        ctx.progress("the core's entry writer alone (loadtests/c/bench_entries.c) ...")
        writer = core_writer()
    finally:
        shutil.rmtree(SCRATCH, ignore_errors=True)
    if any(info["deleted_segments"] == 0 for runs in counters.values() for info in runs):
        ctx.progress("WARNING: a Comet case ran without retention deleting a segment")
    switches = [f"{f} = {getattr(Config(), f)!r}" for f in Config.__dataclass_fields__
                if re.search(r"recycl|prefault|populate|preallocat", f)]
    mode = "quick" if args.quick and not args.gb else f"--gb {args.gb}" if args.gb else "default"
    deleted = "; ".join(f"{k} " + ", ".join(f"{c.removesuffix('_segments')} "
                                           + "/".join(str(i[c]) for i in v) for c in v[0]
                                           if c.endswith("_segments"))
                        for k, v in counters.items())
    notes = [
        "- Go Comet: its own write benchmarks as quoted in issue 14 (not measured here), ns per "
        "call at 1 / 10 / 100 / 1000 entries per call: "
        + " / ".join(f"{v:,}" for v in GO_NS_PER_CALL.values())
        + "; targets: at least 1.5× faster at every batch size, and Comet within "
        f"{FLOOR_TARGET:.0f}× of the warm-page floor at 1000 entries.",
        f"- Volume: {volume / GiB:.2f} GiB of stored bytes per case and round ("
        + (f"min(2 GiB, 10 × the dirty limit = {10 * dirty / GiB:.1f} GiB), the dirty limit "
           f"being {dirty_text}" if mode == "default" else
           f"{mode}: NOT the full volume") + "), "
        + ", ".join(f"{b.calls:,} calls of {b.n}" for b in batches.values())
        + f"; {header} stored bytes per entry beyond its payload. Median of {args.rounds} "
        f"interleaved rounds after a warm-up round at {WARMUP_SHARE:.0%} of the volume.",
        f"- Comet: Python API, Config.writer(shards=1) (segment_bytes {Config().segment_bytes // MiB} "
        f"MiB, durability {Config().durability!r}) plus the case's retention ("
        + "; ".join(f"{k}: {f(volume)}" for k, (_, f) in RETENTION.items())
        + "), one stream of one shard on a fresh directory per case and round; close() inside "
        f"the timing. Segments deleted by retention (and recycled, when the core counts them) "
        f"during each case, by round: {deleted}.",
        f"- Warm-page floor: the call's stored bytes (a {header}-byte header + payload per entry, "
        f"joined once) copied by slice assignment into a {MAP_BYTES // MiB} MiB anonymous "
        "mapping (MAP_POPULATE, every page written first), round-robin, the same volume; its "
        "per-call Python cost is included. Buffered file: the same bytes, one f.write per call "
        f"through a {FILE_BUFFER >> 10} KiB buffer, into a fresh file in the same scratch "
        "filesystem, close() inside the timing.",
        "- Recycling / prefaulting switches in storage_c.Config: "
        + ("; ".join(switches) + ", left at the default" if switches else "none") + ".",
        "- The core's entry writer alone: loadtests/c/bench_entries.c, the same 1000 payloads "
        "written by entry_write_group (header, copy and CRC32C per entry, as an append does "
        "under the shard lock) into a pre-faulted 64 MiB mapping, against one memcpy of the "
        "joined bytes into it: the CPU work no choice about pages removes (there, "
        + ", ".join(f"{k} {v['ns_per_call']:,.0f}" for k, v in writer.items()) + " ns/call).",
        benchlib.cpu_note(probes),
    ]
    ctx.write(args, "storage", "Storage benchmark at sustained volume", build_rows(series, writer),
              notes,
              {"mode": mode, "scale": {"rounds": args.rounds, "bytes_per_case": volume,
                                       "calls": {str(n): b.calls for n, b in batches.items()}},
               "dirty_limit_bytes": dirty, "dirty_limit_source": dirty_text,
               "header_bytes": header, "payload_bytes": PAYLOAD_BYTES,
               "retention": {k: f(volume) for k, (_, f) in RETENTION.items()},
               "go_reference_ns_per_call": GO_NS_PER_CALL, "targets_ns_per_call": TARGET_NS_PER_CALL,
               "series": {k: v.to_json() for k, v in series.items()}, "comet_counters": counters,
               "other_cpu_by_case": probes, "batch_sweep": batch_sweep(series),
               "core_writer_1000": writer},
              extra_md="ns per entry by batch size, same run:\n\n" + entry_table(series))
    return 0


if __name__ == "__main__":
    sys.exit(main())
