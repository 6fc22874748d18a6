"""Consumer benchmark: what an ack, a read-and-ack loop and `comet ship` cost.

Reproduce (from the repository root)::

    .venv/bin/python loadtests/bench_consumers.py            # 5 runs per case
    .venv/bin/python loadtests/bench_consumers.py --quick    # 3 runs, smaller counts

Cases, each the median of several runs on a fresh data directory on the disk
that holds the repository, with the page-allocator warm-up of benchlib:

- ack from Python: ``Group.ack(entry)`` and ``Consumer.ack(shard, entry)``
  with increasing entries (target <= 400 ns; Go Comet: 30-200 ns);
- read + ack from Python: ``Consumer.read(1000)``, the payloads
  materialised, ``ack_batch`` - entries/s (target >= 3 M/s);
- ``comet ship`` to a directory: 1 KiB JSON events, one thread, zstd level 1
  (its default), MB/s of raw events (target >= 150 MB/s).  Anchor in the same run: the same
  NDJSON compressed with zstandard and written to files with nothing else -
  the floor any shipper pays.

Results: a markdown table on stdout and in loadtests/results/consumers.md,
every run in loadtests/results/consumers.json.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import orjson
import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

from consumers import Consumer, DirectorySink, ShipConfig, Shipper  # noqa: E402
from storage_c import Config, Log  # noqa: E402

HERE = Path(__file__).resolve().parent
SCRATCH = HERE / ".scratch" / "consumers"
RESULTS = HERE / "results"
MB = 1_000_000


@dataclass(frozen=True)
class Scale:
    runs: int
    acks: int
    read_entries: int
    ship_mb: int


FULL = Scale(runs=5, acks=1_000_000, read_entries=2_000_000, ship_mb=256)
QUICK = Scale(runs=3, acks=300_000, read_entries=1_000_000, ship_mb=96)


def fresh_log(name: str, **config: object) -> Log:
    path = benchlib.fresh_dir(SCRATCH / name)
    return Log(path / "data", Config(shards=4, background_flush=False, retention_interval_ms=0,
                                     **config))  # type: ignore[arg-type]


def fill_small(log: Log, stream: str, shard: int, n: int) -> None:
    payload = b'{"ts":1700000000123,"level":"info","svc":"edge-gw","msg":"request served"}'
    batch = [payload.ljust(100)] * 1000
    for _ in range(n // 1000):
        log.append_batch(stream, batch, shard=shard)


def ack_group(scale: Scale) -> float:
    with fresh_log("ack") as log:
        fill_small(log, "a", 0, scale.acks)
        group = log.group("a", 0, "g")
        ack = group.ack
        benchlib.warm_page_allocator(SCRATCH)
        t0 = time.perf_counter()
        for e in range(scale.acks):
            ack(e)
        return (time.perf_counter() - t0) / scale.acks * 1e9


def ack_consumer(scale: Scale) -> float:
    with fresh_log("ack-consumer") as log:
        fill_small(log, "a", 0, scale.acks)
        with Consumer(log, "a", "g") as c:
            ack = c.ack
            t0 = time.perf_counter()
            for e in range(scale.acks):
                ack(0, e)
            return (time.perf_counter() - t0) / scale.acks * 1e9


def read_and_ack(scale: Scale) -> float:
    with fresh_log("read-ack") as log:
        fill_small(log, "r", 1, scale.read_entries)
        with Consumer(log, "r", "g", shards=[1]) as c:
            benchlib.warm_page_allocator(SCRATCH)
            done = 0
            t0 = time.perf_counter()
            while done < scale.read_entries:
                batch = c.read(1000)
                payloads = batch.payloads
                done += len(payloads)
                c.ack_batch(batch)
            return done / (time.perf_counter() - t0)


def json_events(n: int, seed: int) -> list[bytes]:
    """~1 KiB JSON events with varied fields (compressible like real logs, not trivially)."""
    rng = random.Random(seed)
    words = [f"w{rng.randrange(10_000)}" for _ in range(2000)]
    out = []
    for i in range(n):
        event = {"ts": 1_700_000_000_000 + i, "level": rng.choice(["info", "warn", "error"]),
                 "svc": f"edge-{rng.randrange(20)}", "trace": f"{rng.getrandbits(64):016x}",
                 "user": f"u{rng.randrange(10**6):06d}", "ms": round(rng.random() * 100, 3),
                 "msg": ""}
        room = 1023 - len(orjson.dumps(event))
        event["msg"] = " ".join(rng.choices(words, k=200))[:room]
        out.append(orjson.dumps(event))
    return out


def fill_events(log: Log, mb: int) -> int:
    events = json_events(4000, seed=7)
    raw = 0
    log.create_stream("ship", 4)
    shard = 0
    while raw < mb * MB:
        log.append_batch("ship", events, shard=shard % 4)
        raw += sum(map(len, events)) + len(events)  # NDJSON adds a newline per event
        shard += 1
    return raw


def ship_directory(scale: Scale) -> float:
    with fresh_log("ship", segment_bytes=256 << 20) as log:
        raw = fill_events(log, scale.ship_mb)
        sink = DirectorySink(SCRATCH / "ship" / "lake")
        with Consumer(log, "ship", "ship") as c:
            benchlib.warm_page_allocator(SCRATCH)
            t0 = time.perf_counter()
            stats = Shipper(c, sink, ShipConfig()).run(once=True)
            dt = time.perf_counter() - t0
        assert stats.raw_bytes == raw, (stats.raw_bytes, raw)
        return raw / dt / MB


def compress_and_write(scale: Scale) -> float:
    """The anchor: the same NDJSON, zstd level 1, written to 64 MB files."""
    events = json_events(4000, seed=7)
    chunk = b"".join(e + b"\n" for e in events)
    out = benchlib.fresh_dir(SCRATCH / "anchor")
    compressor = zstandard.ZstdCompressor(level=1, write_content_size=True)
    per_object = max(1, (64 * MB) // len(chunk))
    total = 0
    benchlib.warm_page_allocator(SCRATCH)
    t0 = time.perf_counter()
    n = 0
    while total < scale.ship_mb * MB:
        data = compressor.compress(chunk * per_object)
        with open(out / f"{n}.zst", "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        total += len(chunk) * per_object
        n += 1
    return total / (time.perf_counter() - t0) / MB


@dataclass(frozen=True)
class Row:
    case: str
    series: str
    unit: str
    target: str
    met: bool | None
    anchor: str


@dataclass(frozen=True)
class RowSpec:
    """A row of the table: its target (op, value in the series' unit) and its anchor."""

    case: str
    series: str
    target_text: str = "—"
    target: tuple[str, float] | None = None
    anchor: str | None = None        # series measured in the same run
    anchor_name: str = ""
    reference: str | None = None     # a figure quoted, not measured here


ROW_SPECS = (
    RowSpec("Python: Group.ack(entry)", "ack_group", "≤ 400 ns", ("<=", 400),
            reference="Go Comet 30–200 ns (reference, not measured)"),
    RowSpec("Python: Consumer.ack(shard, entry)", "ack_consumer", "≤ 400 ns", ("<=", 400)),
    RowSpec("Python: read(1000) + payloads + ack", "read_ack", "≥ 3 M entries/s", (">=", 3e6)),
    RowSpec("comet ship → directory, 1 KiB JSON", "ship_dir", "≥ 150 MB/s", (">=", 150),
            "compress_write", "zstd-1 + write of the same bytes"),
    RowSpec("Anchor: zstd level 1 + write, no shipper", "compress_write"),
)


def structured_rows(series: dict[str, dict[str, object]]) -> list[dict[str, object]]:
    """The table's rows as loadtests/report.py reads them (benchlib.result_row), from the
    "series" section of consumers.json (all figures here: higher is better except ns/call)."""
    out = []
    for spec in ROW_SPECS:
        if spec.series not in series:
            continue
        s = series[spec.series]
        value, unit = float(s["median"]), str(s["unit"])  # type: ignore[arg-type]
        anchor, ratio = None, None
        if spec.anchor is not None and spec.anchor in series:
            a = series[spec.anchor]
            a_value, a_unit = float(a["median"]), str(a["unit"])  # type: ignore[arg-type]
            anchor = benchlib.anchor_ref(spec.anchor, spec.anchor_name, a_value, a_unit,
                                         fmt(a_value, a_unit))
            ratio = value / a_value if unit != "ns/call" else a_value / value
        passed = None
        if spec.target is not None:
            op, bound = spec.target
            passed = value <= bound if op == "<=" else value >= bound
        out.append(benchlib.result_row(
            spec.case, spec.series, value, unit, fmt(value, unit),
            role="anchor" if spec.case.startswith("Anchor:") else "case", anchor=anchor,
            ratio=ratio, ratio_text="—" if ratio is None else f"{ratio:.2f}×",
            target=None if spec.target is None else {"op": spec.target[0],
                                                     "value": spec.target[1], "unit": unit},
            target_text=spec.target_text, passed=passed, reference=spec.reference))
    return out


def run(scale: Scale) -> tuple[dict[str, benchlib.Series], list[Row]]:
    series = {
        "ack_group": benchlib.repeat("ack_group", "ns/call", scale.runs, lambda _i: ack_group(scale)),
        "ack_consumer": benchlib.repeat("ack_consumer", "ns/call", scale.runs,
                                        lambda _i: ack_consumer(scale)),
        "read_ack": benchlib.repeat("read_ack", "entries/s", scale.runs,
                                    lambda _i: read_and_ack(scale)),
        "ship_dir": benchlib.repeat("ship_dir", "MB/s", scale.runs, lambda _i: ship_directory(scale)),
        "compress_write": benchlib.repeat("compress_write", "MB/s", scale.runs,
                                          lambda _i: compress_and_write(scale)),
    }
    rows = []
    for r in structured_rows({k: v.to_json() for k, v in series.items()}):
        anchor = r["reference"] or "—"
        if r["anchor"] is not None:
            anchor = f"{r['ratio']:.2f}× {r['anchor']['name']}"  # type: ignore[index]
        rows.append(Row(str(r["case"]), str(r["key"]), str(r["unit"]), str(r["target_text"]),
                        r["pass"], anchor))  # type: ignore[arg-type]
    return series, rows


def fmt(value: float, unit: str) -> str:
    if unit == "entries/s":
        return f"{value / 1e6:.2f} M entries/s"
    if unit == "MB/s":
        return f"{value:.0f} MB/s"
    return f"{value:.0f} ns/call"


def report(series: dict[str, benchlib.Series], rows: list[Row], scale: Scale,
           machine: dict[str, object]) -> str:
    table = benchlib.markdown_table(
        ("Case", "Measured (median)", "Target", "Pass", "vs anchor", "Runs min–max"),
        [[r.case, fmt(series[r.series].median, r.unit), r.target,
          "—" if r.met is None else ("PASS" if r.met else "FAIL"), r.anchor,
          f"{fmt(min(series[r.series].runs), r.unit)} – {fmt(max(series[r.series].runs), r.unit)}"]
         for r in rows])
    notes = [
        f"- Median of {scale.runs} runs; acks over {scale.acks:,} entries; read over "
        f"{scale.read_entries:,} 100-byte entries; ship of {scale.ship_mb} MB of ~1 KiB JSON "
        "events in 4 shards, one thread, objects of up to 64 MiB.",
        f"- Machine: {machine['nproc']} CPUs, {machine['cpu_model']}, kernel {machine['kernel']}, "
        f"Python {machine['python']}, scratch on {machine['scratch_filesystem']}; "
        f"{machine['date_utc']}.",
    ]
    if "commit" in machine:
        notes.append(f"- Code: commit {machine['commit']}; consumers/, storage_c/ changed since: "
                     f"{machine['code_changed_since_commit']}"
                     + ("; CHANGED DURING THE RUN" if machine.get("code_changed_during_run")
                        else "") + ".")
    return "# Consumer benchmark\n\n" + table + "\n\nNotes:\n\n" + "\n".join(notes) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    scale = QUICK if args.quick else FULL
    SCRATCH.mkdir(parents=True, exist_ok=True)
    source = benchlib.source_state(HERE.parent, ["consumers", "storage_c"])
    t0 = time.perf_counter()
    try:
        series, rows = run(scale)
        machine = benchlib.machine_info(SCRATCH)
        machine.update(source)
        machine["code_changed_during_run"] = benchlib.source_state(
            HERE.parent, ["consumers", "storage_c"]) != source
        text = report(series, rows, scale, machine)
        print(text)
        benchlib.write_atomic(RESULTS / "consumers.md", text)
        series_json = {k: v.to_json() for k, v in series.items()}
        benchlib.write_json(RESULTS / "consumers.json", {
            "machine": machine, "mode": "quick" if args.quick else "default",
            "scale": scale.__dict__, "series": series_json,
            "rows": structured_rows(series_json),
            "elapsed_s": round(time.perf_counter() - t0, 1)})
    finally:
        benchlib.clear_dir(SCRATCH)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
