"""Forwarding benchmark: `comet ship` draining a backlog of OTLP log records to an
OTLP/HTTP receiver, against the receiver's own rate when wrk posts it the same requests,
in the same run; then the catch-up after an outage while ingest goes on.

    .venv/bin/python -m loadtests.bench_forward [--quick] [--outage-seconds S]

The receiver is `comet serve` (2 workers, a fresh data directory per run): the edge box to
regional gateway case.  The backlog: 1 M log records (--quick: 300 k) as the gateway
stores them from the OTLP benchmark's requests (bench_otlp.logs_request: ~40-byte bodies,
three attributes, trace context), in 8 shards, durable.
- Anchor: wrk -t1 -c8 posts the shipper's own first request (1,000 records, protobuf,
  gzip) with a fresh Idempotency-Key each time (loadtests/wrk/otlp_keyed.lua), 10 s.
- Drain: `comet ship DATA otel-logs http://receiver --once` (defaults: 4 in flight, 1,000
  records a request); records/s = backlog / wall time; the receiver must then hold
  exactly the backlog.  Target: at least 0.7x the anchor.
- Catch-up: an edge gateway takes OTLP at --ingest-rate records/s (wrk, paced) while the
  receiver is away for --outage-seconds, then `comet ship` starts and the backlog drains
  while ingest goes on; the figure is the time until the lag is back under one second of
  ingest.  Target: under the outage's own length (a 10-minute outage drained in under
  10 minutes); with --outage-seconds below 600 the 600 s figure is extrapolated from the
  measured drain rate (the drain time is linear in the backlog), and said so.
Rounds alternate anchor and drain; a ratio is the median of per-round ratios.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run by its path: again as a module
    from by_path import rerun_as_module  # type: ignore[import-not-found]

    rerun_as_module(__file__)

import gzip
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from loadtests import bench_gateway as gw
from loadtests import benchlib
from loadtests.bench_otlp import logs_request
from storage_c import Config, Log, decode_otlp
from storage_c.otlp import encode
from tests.support.server import SMALL, GatewayProcess

LOADTESTS = Path(__file__).resolve().parent
SCRATCH = LOADTESTS / ".scratch" / "forward"
COMET = Path(sys.executable).with_name("comet")
TARGET = 0.7
SHARDS = 8
RECEIVER_ENV = {k: v for k, v in SMALL.items() if k != "COMET_ACCESS_LOG"}


def make_backlog(path: Path, records: int) -> int:
    """``records`` log records as the gateway stores them, round robin over the shards."""
    rng = random.Random(1)
    bodies = [decode_otlp("logs", logs_request(rng), 0).events.split(b"\n")[:-1] for _ in range(50)]
    made = 0
    with Log(path, Config(shards=SHARDS)) as log:
        log.create_stream("otel-logs", SHARDS)
        while made < records:
            for events in bodies:
                log.append_batch("otel-logs", events[: records - made])
                made += min(len(events), records - made)
                if made >= records:
                    break
        log.sync()
    return made


def first_request(backlog: Path) -> Path:
    """The shipper's first request body (1,000 records, protobuf, gzip), for the anchor."""
    with Log(backlog, Config.reader()) as log:
        read = log.read("otel-logs", 0, 0, 1000)
        body = SCRATCH / "request.pb.gz"
        body.write_bytes(gzip.compress(encode("logs", read.data, read.offsets).request, 1, mtime=0))
    return body


def receiver(label: str) -> GatewayProcess:
    server = GatewayProcess(benchlib.fresh_dir(SCRATCH / label), 2, env=RECEIVER_ENV,
                            log_path=SCRATCH / f"{label}.log")
    server.wait_ready(30)
    return server


def stored(server: GatewayProcess) -> int:
    with Log(server.data_dir, Config.reader()) as log:
        return log.stats("otel-logs").entries if "otel-logs" in log.streams() else 0


def anchor_run(wrk: str, body: Path, label: str, load_s: float) -> dict[str, Any]:
    with receiver(label) as server:
        argv = [wrk, "-t1", "-c8", f"-d{int(load_s) + 2}s", "-s", str(LOADTESTS / "wrk" / "otlp_keyed.lua"),
                f"{server.url}/v1/logs", "--", f"stop_after={load_s}", "events=1000", "accept=200"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=load_s + 60,
                              env={**os.environ, "BODY_FILE": str(body)})
        summary = next(__import__("json").loads(x[8:]) for x in done.stdout.splitlines()
                       if x.startswith("WRKJSON "))
        records = stored(server)
    assert records == summary["accepted_202"] * 1000 and not summary["non_202"], summary
    return {"records_per_s": records / summary["window_s"], "records": records, "wrk": summary}


def drain_run(backlog: Path, label: str, records: int) -> dict[str, Any]:
    data = SCRATCH / f"{label}-edge"
    shutil.rmtree(data, ignore_errors=True)
    shutil.copytree(backlog, data)
    with receiver(label) as server:
        t0 = time.perf_counter()
        before = os.times()
        done = subprocess.run([str(COMET), "ship", str(data), "otel-logs", server.url, "--once",
                               "--status-interval", "0"], capture_output=True, text=True, timeout=900)
        wall = time.perf_counter() - t0
        cpu = os.times()
        assert done.returncode == 0, done.stderr[-2000:]
        got = stored(server)
    shutil.rmtree(data, ignore_errors=True)
    assert got == records, f"the receiver holds {got} records, the backlog {records}"
    return {"records_per_s": records / wall, "wall_s": wall,
            "shipper_cpu_s": (cpu.children_user + cpu.children_system) - (before.children_user
                                                                          + before.children_system)}


def catch_up(wrk: str, outage_s: float, rate: float) -> dict[str, Any]:
    """Edge ingest at ``rate`` records/s; the receiver away for ``outage_s``; then the drain."""
    from tests.support.otlp_http import PROTOBUF  # noqa: F401  (the tests' request headers)

    body = SCRATCH / "ingest.pb"
    body.write_bytes(logs_request(random.Random(2)))
    with GatewayProcess(benchlib.fresh_dir(SCRATCH / "catchup-edge"), 2, env=RECEIVER_ENV,
                        log_path=SCRATCH / "catchup-edge.log") as edge:
        edge.wait_ready(30)
        total_s = outage_s * 3 + 60
        load = subprocess.Popen(
            [wrk, "-t1", "-c4", f"-d{int(total_s) + 2}s", "-s", str(LOADTESTS / "wrk" / "file_body.lua"),
             f"{edge.url}/v1/logs", "--", f"stop_after={total_s}", f"rate={rate / 100:.3f}", "events=100",
             "accept=200"], stdout=subprocess.PIPE, text=True,
            env={**os.environ, "BODY_FILE": str(body), "BODY_TYPE": "application/x-protobuf"})
        time.sleep(outage_s)  # the receiver is away: the backlog grows
        with Log(edge.data_dir, Config.reader()) as log:
            backlog = log.stats("otel-logs").entries
        with receiver("catchup-region") as region:
            shipper = subprocess.Popen([str(COMET), "ship", str(edge.data_dir), "otel-logs", region.url,
                                        "--group", "region", "--status-interval", "0"],
                                       stderr=subprocess.DEVNULL)
            t0 = time.perf_counter()
            drained = None
            with Log(edge.data_dir, Config.reader()) as log:
                while time.perf_counter() - t0 < 2 * outage_s + 30:
                    time.sleep(0.5)
                    lag = log.stats("otel-logs").group_lag().get("region")
                    if lag is not None and lag.lag <= rate:
                        drained = time.perf_counter() - t0
                        break
            shipper.terminate()
            shipper.wait(60)
        load.terminate()
        load.wait(60)
    return {"outage_s": outage_s, "ingest_rate": rate, "backlog_records": backlog,
            "drain_s": drained, "net_drain_per_s": backlog / drained if drained else None}


def main(argv: list[str] | None = None) -> int:
    p = benchlib.parser(__doc__, "1 round, a 300 k backlog, a 20 s outage")
    p.add_argument("--outage-seconds", type=float, default=None,
                   help="the catch-up's outage (default 60; --quick 20; 600 for the full 10 minutes)")
    p.add_argument("--ingest-rate", type=float, default=20_000, help="records/s the edge takes")
    args = p.parse_args(argv)
    wrk = shutil.which("wrk") or sys.exit("wrk is missing: run `make bench-deps` (apt-get install wrk)")
    rounds, records = (1, 300_000) if args.quick else (3, 1_000_000)
    outage = args.outage_seconds or (20.0 if args.quick else 60.0)
    ctx = benchlib.Context("bench_forward", SCRATCH, ["consumers", "storage_c", "gateway"])
    backlog = benchlib.fresh_dir(SCRATCH / "backlog")
    ctx.progress(f"backlog: {make_backlog(backlog, records):,} records")
    body = first_request(backlog)
    runs: list[dict[str, Any]] = []
    for i in range(rounds):
        a = anchor_run(wrk, body, f"anchor-{i}", 10.0)
        d = drain_run(backlog, f"drain-{i}", records)
        runs.append({"anchor": a, "drain": d, "ratio": d["records_per_s"] / a["records_per_s"]})
        ctx.progress(f"round {i}: anchor {a['records_per_s']:,.0f}/s, drain {d['records_per_s']:,.0f}/s")
    c = catch_up(wrk, outage, args.ingest_rate)
    ctx.progress(f"catch-up: {c}")
    shutil.rmtree(SCRATCH, ignore_errors=True)

    anchor = benchlib.Series("anchor", "records/s", [r["anchor"]["records_per_s"] for r in runs])
    drain = benchlib.Series("drain", "records/s", [r["drain"]["records_per_s"] for r in runs])
    ratio = benchlib.median([r["ratio"] for r in runs])
    full = 600.0
    projected = c["drain_s"] * full / outage if c["drain_s"] else None
    rows = [
        benchlib.series_row("Anchor: wrk posts the same requests to the receiver", anchor),
        benchlib.row(f"comet ship drains {records:,} records", "drain", drain.median, "records/s",
                     anchor=benchlib.anchor_ref("anchor", "receiver's own rate", anchor.median,
                                                "records/s"),
                     ratio=ratio, ratio_text=f"{ratio:.2f}× (rounds: "
                     + ", ".join(f"{r['ratio']:.2f}" for r in runs) + ")",
                     target={"op": ">=", "value": TARGET, "unit": "x"}, target_text=f"≥ {TARGET}× anchor",
                     runs_text=benchlib.runs_text(drain)),
        benchlib.row(f"Catch-up: {outage:.0f} s outage at {args.ingest_rate:,.0f} records/s, "
                     "drained while ingest goes on", "catch_up", c["drain_s"], "s",
                     figure_text=f"{c['drain_s']:.1f} s" if c["drain_s"] else "not drained",
                     target={"op": "<=", "value": outage, "unit": "s"}, target_text=f"< {outage:.0f} s",
                     reference=None if outage >= full or projected is None else
                     f"600 s outage: {projected:.0f} s (extrapolated)",
                     runs_text=f"backlog {c['backlog_records']:,} records"),
    ]
    cpu = benchlib.median([r["drain"]["shipper_cpu_s"] for r in runs])
    ctx.write(args, "forward", "Forwarding benchmark (comet ship to OTLP/HTTP)", rows, [
        f"- {rounds} round(s), anchor and drain alternating; receiver: `comet serve`, 2 workers, "
        "fresh data directory per run; everything on this machine's 2 CPUs.",
        f"- The shipper used {cpu:.1f} s of CPU for {records:,} records "
        f"({cpu / records * 1e6:.2f} µs per record): reading, encoding (storage_c's encoder), "
        "igzip, HTTP; the rest of the machine went to the receiver."],
        {"runs": runs, "catch_up": c, "records": records})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
