"""Consumer benchmark: acks, read + ack, and `comet ship` to a directory against zstd 1
and a write of the same NDJSON (its anchor), in the same run.

    .venv/bin/python -m loadtests.bench_consumers [--quick]
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run by its path: again as a module
    from by_path import rerun_as_module  # type: ignore[import-not-found]

    rerun_as_module(__file__)

import os
import random
import shutil
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable

import orjson
import zstandard

from consumers import Consumer, DirectorySink, ShipConfig, Shipper
from loadtests import benchlib
from storage_c import Config, Log

SCRATCH = Path(__file__).resolve().parent / ".scratch" / "consumers"
MB = 1_000_000


@dataclass(frozen=True)
class Scale:
    runs: int
    acks: int
    read_entries: int
    ship_mb: int


FULL, QUICK = Scale(5, 1_000_000, 2_000_000, 256), Scale(3, 300_000, 1_000_000, 96)


def fresh_log(name: str, **config: Any) -> Log:
    return Log(benchlib.fresh_dir(SCRATCH / name) / "data",
               Config(shards=4, background_flush=False, retention_interval_ms=0, **config))


def fill_small(log: Log, stream: str, shard: int, n: int) -> None:
    batch = [b'{"ts":1700000000123,"level":"info","svc":"edge-gw","msg":"request served"}'
             .ljust(100)] * 1000
    for _ in range(n // 1000):
        log.append_batch(stream, batch, shard=shard)


def ack_group(scale: Scale) -> float:
    with fresh_log("ack") as log:
        fill_small(log, "a", 0, scale.acks)
        ack = log.group("a", 0, "g").ack
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
                done += len(batch.payloads)
                c.ack_batch(batch)
            return done / (time.perf_counter() - t0)


def json_events(n: int, seed: int = 7) -> list[bytes]:
    """~1 KiB JSON events with varied fields (compressible like real logs, not trivially)."""
    rng = random.Random(seed)
    words = [f"w{rng.randrange(10_000)}" for _ in range(2000)]
    out = []
    for i in range(n):
        event = {"ts": 1_700_000_000_000 + i, "level": rng.choice(["info", "warn", "error"]),
                 "svc": f"edge-{rng.randrange(20)}", "trace": f"{rng.getrandbits(64):016x}",
                 "user": f"u{rng.randrange(10**6):06d}", "ms": round(rng.random() * 100, 3),
                 "msg": ""}
        event["msg"] = " ".join(rng.choices(words, k=200))[:1023 - len(orjson.dumps(event))]
        out.append(orjson.dumps(event))
    return out


def ship_directory(scale: Scale) -> float:
    """MB/s of raw NDJSON shipped by ``Shipper`` (what ``comet ship`` runs) to a directory."""
    with fresh_log("ship", segment_bytes=256 << 20) as log:
        events, raw, shard = json_events(4000), 0, 0
        log.create_stream("ship", 4)
        while raw < scale.ship_mb * MB:
            log.append_batch("ship", events, shard=shard % 4)
            raw += sum(map(len, events)) + len(events)  # NDJSON adds a newline per event
            shard += 1
        with Consumer(log, "ship", "ship") as c:
            benchlib.warm_page_allocator(SCRATCH)
            t0 = time.perf_counter()
            stats = Shipper(c, DirectorySink(SCRATCH / "ship" / "lake"), ShipConfig()).run(once=True)
            dt = time.perf_counter() - t0
        assert stats.raw_bytes == raw, (stats.raw_bytes, raw)
        return raw / dt / MB


def compress_and_write(scale: Scale) -> float:
    """The anchor: the same NDJSON, zstd level 1, written to 64 MB files and fsynced."""
    chunk = b"".join(e + b"\n" for e in json_events(4000))
    out = benchlib.fresh_dir(SCRATCH / "anchor")
    compressor = zstandard.ZstdCompressor(level=1, write_content_size=True)
    per_object = max(1, (64 * MB) // len(chunk))
    total = n = 0
    benchlib.warm_page_allocator(SCRATCH)
    t0 = time.perf_counter()
    while total < scale.ship_mb * MB:
        with open(out / f"{n}.zst", "wb") as f:
            f.write(compressor.compress(chunk * per_object))
            f.flush()
            os.fsync(f.fileno())
        total += len(chunk) * per_object
        n += 1
    return total / (time.perf_counter() - t0) / MB


# case, series, unit, measure, target (op, value) and its text, anchor, reference
CASES: tuple[tuple[str, str, str, Callable[[Scale], float], tuple[str, float] | None, str,
                   str | None, str | None], ...] = (
    ("Python: Group.ack(entry)", "ack_group", "ns/call", ack_group, ("<=", 400), "≤ 400 ns", None,
     "Go Comet 30–200 ns (reference, not measured)"),
    ("Python: Consumer.ack(shard, entry)", "ack_consumer", "ns/call", ack_consumer, ("<=", 400),
     "≤ 400 ns", None, None),
    ("Python: read(1000) + payloads + ack", "read_ack", "entries/s", read_and_ack, (">=", 3e6),
     "≥ 3 M entries/s", None, None),
    ("comet ship → directory, 1 KiB JSON", "ship_dir", "MB/s", ship_directory, (">=", 150),
     "≥ 150 MB/s", "compress_write", None),
    ("Anchor: zstd level 1 + write, no shipper", "compress_write", "MB/s", compress_and_write,
     None, "—", None, None),
)


def main(argv: list[str] | None = None) -> int:
    args = benchlib.parser(__doc__, "3 runs, smaller counts").parse_args(argv)
    scale = QUICK if args.quick else FULL
    ctx = benchlib.Context("bench_consumers", SCRATCH, ["consumers", "storage_c"])
    try:
        series = {key: benchlib.repeat(key, unit, scale.runs, partial(fn, scale))
                  for _, key, unit, fn, *_ in CASES}
    finally:
        shutil.rmtree(SCRATCH, ignore_errors=True)
    rows = [benchlib.series_row(case, series[key], series.get(anchor or ""),
                                "zstd-1 + write of the same bytes", target, target_text, reference)
            for case, key, _, _, target, target_text, anchor, reference in CASES]
    ctx.write(args, "consumers", "Consumer benchmark", rows, [
        f"- Median of {scale.runs} runs; acks over {scale.acks:,} entries; read over "
        f"{scale.read_entries:,} 100-byte entries; ship of {scale.ship_mb} MB of ~1 KiB JSON "
        "events in 4 shards, one thread, objects of up to 64 MiB."],
        {"scale": asdict(scale), "series": {k: v.to_json() for k, v in series.items()}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
