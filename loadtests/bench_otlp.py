"""OTLP/HTTP benchmark: 100-record protobuf export requests (logs, spans) against the
NDJSON path carrying the same records as the JSON events they become, in the same run.

    .venv/bin/python -m loadtests.bench_otlp [--quick]   # 3 rounds of 10 s (--quick: 1 of 5 s)

wrk posts one body over and over (loadtests/wrk/file_body.lua) to a fresh 2-worker
`comet serve` per run (bench_gateway.one_run: the same server, wrk settings and checks:
stored entries must equal acknowledged records).  A ratio is the median of per-round
ratios of records/s.  Target: the OTLP path at least 0.5x the NDJSON path.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run by its path: again as a module
    from by_path import rerun_as_module  # type: ignore[import-not-found]

    rerun_as_module(__file__)

import random
import shutil
import signal
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import orjson

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.logs.v1.logs_pb2 import SeverityNumber
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from loadtests import bench_gateway as gw
from loadtests import benchlib
from tests.support import otlp
from tests.support.otlp_http import key_values

BODIES = gw.SCRATCH.parent / "otlp-bodies"
RECORDS = 100
TARGET = 0.5
T0 = 1_764_240_000_000_000_000
RESOURCE = {"service.name": "checkout", "host.name": "edge-1"}


def logs_request(rng: random.Random) -> bytes:
    """A request like an SDK's: one resource and scope, records with a ~40-byte body,
    three attributes, trace context."""
    request = ExportLogsServiceRequest()
    group = request.resource_logs.add()
    group.resource.attributes.extend(key_values(RESOURCE))
    scope = group.scope_logs.add()
    scope.scope.name, scope.scope.version = "app.orders", "1.4.2"
    for i in range(RECORDS):
        record = scope.log_records.add()
        record.time_unix_nano = record.observed_time_unix_nano = T0 + i * 1_000_003
        record.severity_number, record.severity_text = SeverityNumber.SEVERITY_NUMBER_INFO, "INFO"
        record.body.string_value = f"order {rng.randrange(10**6)} paid in {rng.randrange(900)} ms ok"
        record.attributes.extend(key_values({"http.method": "POST", "http.status_code": 200,
                                             "duration_s": rng.random()}))
        record.trace_id, record.span_id, record.flags = rng.randbytes(16), rng.randbytes(8), 1
    return bytes(request.SerializeToString())


def traces_request(rng: random.Random) -> bytes:
    """Spans of one service: ids, parent, kind, times, four attributes, an OK status."""
    request = ExportTraceServiceRequest()
    group = request.resource_spans.add()
    group.resource.attributes.extend(key_values(RESOURCE))
    scope = group.scope_spans.add()
    scope.scope.name, scope.scope.version = "app.orders", "1.4.2"
    trace = rng.randbytes(16)
    for i in range(RECORDS):
        span = scope.spans.add()
        span.trace_id, span.span_id, span.parent_span_id = trace, rng.randbytes(8), rng.randbytes(8)
        span.name, span.kind, span.flags = f"GET /orders/{{id}} {i % 7}", Span.SPAN_KIND_SERVER, 1
        span.start_time_unix_nano = T0 + i * 1_000_003
        span.end_time_unix_nano = span.start_time_unix_nano + rng.randrange(10**8)
        span.attributes.extend(key_values({"http.method": "GET", "http.status_code": 200,
                                           "http.route": "/orders/{id}", "net.peer.port": 443}))
        span.status.code = Status.STATUS_CODE_OK
    return bytes(request.SerializeToString())


def write_bodies() -> dict[str, tuple[Path, Path]]:
    """Per signal: the protobuf request and the NDJSON of its events (the reference's)."""
    BODIES.mkdir(parents=True, exist_ok=True)
    out = {}
    for signal_name, make in (("logs", logs_request), ("traces", traces_request)):
        body = make(random.Random(7))
        events, rejected = otlp.events(signal_name, body)
        assert len(events) == RECORDS and not rejected
        proto, ndjson = BODIES / f"{signal_name}.pb", BODIES / f"{signal_name}.ndjson"
        proto.write_bytes(body)
        ndjson.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
        out[signal_name] = (proto, ndjson)
    return out


def cases(bodies: dict[str, tuple[Path, Path]]) -> list[gw.Case]:
    out = []
    for signal_name, what in (("logs", "log records"), ("traces", "spans")):
        proto, ndjson = bodies[signal_name]
        anchor = gw.Case(f"ndjson_{signal_name}", f"NDJSON: 100 {what} as JSON events "
                         f"({ndjson.stat().st_size // 1000} KB)", "gateway", "file_body.lua",
                         RECORDS, {"BODY_FILE": str(ndjson), "BODY_TYPE": "application/x-ndjson"},
                         240)
        out += [anchor, gw.Case(
            f"otlp_{signal_name}", f"OTLP: 100 {what}, protobuf ({proto.stat().st_size // 1000} KB)",
            "gateway", "file_body.lua", RECORDS,
            {"BODY_FILE": str(proto), "BODY_TYPE": "application/x-protobuf"}, 240,
            anchor=anchor.key, bound=TARGET, path=f"/v1/{signal_name}",
            stream=f"otel-{signal_name}", accept=200)]
    return out


def main(argv: list[str] | None = None) -> int:
    args = benchlib.parser(__doc__, "1 round of 5 s (default: 3 rounds of 10 s)").parse_args(argv)
    scale = gw.Scale(1, 5, 2) if args.quick else gw.Scale(3, 10, 3)
    signal.signal(signal.SIGTERM, lambda n, f: sys.exit(128 + n))
    wrk = shutil.which("wrk") or sys.exit("wrk is missing: run `make bench-deps` (apt-get install wrk)")
    benchlib.fresh_dir(gw.SCRATCH)
    ctx = benchlib.Context("bench_otlp", gw.SCRATCH, [*gw.MEASURED_CODE, "loadtests/bench_otlp.py"])
    all_cases = cases(write_bodies())
    every = [gw.one_run(wrk, all_cases[1], "warmup", scale.warmup_load_s)]
    records: dict[str, list[dict[str, Any]]] = {c.key: [] for c in all_cases}
    for i in range(scale.runs):
        ctx.progress(f"round {i + 1} of {scale.runs}")
        for case in all_cases:
            records[case.key].append(gw.one_run(wrk, case, f"{case.key}-{i}", scale.load_s))
    every += [r for recs in records.values() for r in recs]
    rows = []
    for case in all_cases:
        recs = records[case.key]
        s = benchlib.Series(case.key, "records/s", [r["events_s"] for r in recs])
        checks, reasons = gw.integrity(recs)
        lat = [benchlib.median([r["wrk"]["latency_us"][p] for r in recs]) / 1000 for p in ("p50", "p99")]
        runs_text = f"{benchlib.runs_text(s)}; p50/p99 {lat[0]:.2f}/{lat[1]:.2f} ms; {checks}"
        if case.anchor is None:
            rows.append(benchlib.row(case.title, case.key, s.median, s.unit, role="anchor",
                                     verdict=gw.verdict(None, reasons), runs_text=runs_text))
            continue
        ratio, per_round = gw.paired_ratio(records, case.key, case.anchor)
        anchor = next(c for c in all_cases if c.key == case.anchor)
        a_median = benchlib.median([r["events_s"] for r in records[anchor.key]])
        passed = ratio >= TARGET
        rows.append(benchlib.row(
            case.title, case.key, s.median, s.unit, anchor=benchlib.anchor_ref(
                anchor.key, anchor.title, a_median, "records/s"), ratio=ratio,
            ratio_text=f"{ratio:.2f}× (rounds: {per_round})",
            target={"op": ">=", "value": TARGET, "unit": "x"}, target_text=f"≥ {TARGET:.2f}× NDJSON",
            passed=passed, verdict=gw.verdict(passed, reasons), runs_text=runs_text))
    notes = [f"- Median of {scale.runs} run(s) per case, {scale.load_s} s of load each; wrk "
             f"-t{gw.WRK_THREADS} -c{gw.WRK_CONNECTIONS} on loopback; {gw.WORKERS} workers; a fresh "
             "server and data directory per run; access log on. Records/s = accepted requests × "
             f"{RECORDS}; the NDJSON bodies hold exactly the events the OTLP requests store "
             "(tests/support/otlp.py), validated as every NDJSON body is.",
             benchlib.cpu_note({r["label"]: r["cpu"] for r in every})]
    ctx.write(args, "otlp", "OTLP/HTTP benchmark", rows, notes, {
        "scale": asdict(scale), "runs": every,
        "settings": {"workers": gw.WORKERS, "wrk_connections": gw.WRK_CONNECTIONS, "records": RECORDS}})
    shutil.rmtree(gw.SCRATCH / "data", ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
