"""POST /v1/logs, /v1/traces, /v1/metrics in process: every bad input refused
with a clear google.rpc.Status in the request's encoding and nothing stored
changed, partial success, empty requests, auth, and OTLP's JSON encoding
(hex ids in any case, 64-bit integers as strings or numbers, enums as
integers, unknown fields ignored, every AnyValue kind and every metric type),
which stores exactly what the protobuf of the same request stores."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any, Iterator

import orjson
import pytest
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    AGGREGATION_TEMPORALITY_CUMULATIVE as CUMULATIVE,
    AGGREGATION_TEMPORALITY_DELTA as DELTA,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status as SpanStatus
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.tokens import Token, digest_of
from storage_c import Config

from .support import otlp
from .support.gateway_app import config, stored
from .support.otlp_http import JSON, PROTOBUF, STREAMS, any_value, expected, key_values, log_body, \
    logs_request, typed

KiB = 1 << 10
LIMITS = dict(max_body_bytes=64 * KiB, max_decompressed_bytes=256 * KiB,
              storage=Config(shards=4, segment_bytes=1 << 20, max_entry_bytes=8 * KiB))
RESPONSES: dict[str, Any] = {"logs": ExportLogsServiceResponse, "traces": ExportTraceServiceResponse,
             "metrics": ExportMetricsServiceResponse}


@pytest.fixture
def client(data_dir: Path) -> Iterator[TestClient]:
    with TestClient(create_app(config(data_dir, **LIMITS))) as c:
        yield c


def everything(data_dir: Path) -> dict[str, list[bytes]]:
    """What the three OTLP streams hold."""
    return {stream: stored(data_dir, stream) for stream in STREAMS.values()}


def status_of(response: Any, request_type: str) -> tuple[int, str]:
    """The google.rpc.Status of an error answer, which must come in the
    request's encoding: (code, message)."""
    answered = response.headers["content-type"]
    if request_type == PROTOBUF["content-type"]:
        assert answered == "application/x-protobuf"
        status = Status.FromString(response.content)
        return status.code, status.message
    assert answered == "application/json"
    body = orjson.loads(response.content)
    assert set(body) <= {"code", "message", "details"}, body
    return body.get("code", 0), body.get("message", "")


def deep_array(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = [value]
    return value


def length_delimited(field: int, payload: bytes) -> bytes:
    """One protobuf field of wire type 2 (field < 16, payload < 2**21 bytes)."""
    size, length = len(payload), b""
    while True:
        length += bytes([(size & 0x7F) | (0x80 if size > 0x7F else 0)])
        size >>= 7
        if not size:
            break
    return bytes([field << 3 | 2]) + length + payload


def deep_log_body(depth: int) -> bytes:
    """A logs request whose one record's body nests ``depth`` arrays, encoded
    by hand (protobuf itself refuses to build one past its own depth limit)."""
    value = b"\x0a\x06bottom"  # AnyValue.string_value
    for _ in range(depth):
        value = length_delimited(5, length_delimited(1, value))  # AnyValue.array_value.values
    record = length_delimited(5, value)  # LogRecord.body
    return length_delimited(1, length_delimited(2, length_delimited(2, record)))


def deep_json_array(depth: int) -> Any:
    value: Any = {"stringValue": "bottom"}
    for _ in range(depth):
        value = {"arrayValue": {"values": [value]}}
    return value


def json_logs(record: dict[str, Any]) -> bytes:
    return orjson.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": [record]}]}]})


GOOD = log_body("good", 3)
TRACE = ExportTraceServiceRequest()
TRACE.resource_spans.add().scope_spans.add().spans.add(trace_id=bytes(range(16)), span_id=bytes(8),
                                                       name="a span")
BIG = logs_request("big", [{"body": "x" * (300 * KiB)}]).SerializeToString()
HEX32 = "5b8efff798038103d269b633813fc60c"

# (case, path, content type, extra headers, body, status, google.rpc code, words of the message)
BAD: list[tuple[str, str, str, dict[str, str], Any, int, int, str]] = [
    ("truncated protobuf", "/v1/logs", "application/x-protobuf", {}, GOOD[:-7], 400, 3,
     "not an OTLP logs request"),
    ("garbage", "/v1/logs", "application/x-protobuf", {}, b"\xff" * 32, 400, 3,
     "not an OTLP logs request"),
    ("a traces body on /v1/logs", "/v1/logs", "application/x-protobuf", {},
     TRACE.SerializeToString(), 400, 3, "not an OTLP logs request"),
    ("a traces body on /v1/metrics", "/v1/metrics", "application/x-protobuf", {},
     TRACE.SerializeToString(), 400, 3, "not an OTLP metrics request"),
    ("invalid JSON", "/v1/logs", "application/json", {}, b'{"resourceLogs": [', 400, 3,
     "not valid JSON"),
    ("JSON of no object", "/v1/traces", "application/json", {}, b"[]", 400, 3, "one object"),
    ("JSON of the wrong shape", "/v1/logs", "application/json", {},
     b'{"resourceLogs": {"scopeLogs": []}}', 400, 3, "not an OTLP logs request"),
    ("a string for a number", "/v1/logs", "application/json", {},
     json_logs({"timeUnixNano": "soon"}), 400, 3, "not an OTLP logs request"),
    ("a traces request on /v1/metrics in JSON", "/v1/metrics", "application/json", {},
     b'{"resourceSpans": []}', 200, 0, ""),  # unknown fields are ignored: an empty request
    ("a trace id not hex", "/v1/logs", "application/json", {},
     json_logs({"traceId": "zz" * 16}), 400, 3, "traceId 'zzzz"),
    ("a span id of odd length", "/v1/traces", "application/json", {},
     b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"spanId": "abc"}]}]}]}', 400, 3,
     "spanId 'abc' is not hex"),
    ("a body above max_body_bytes", "/v1/logs", "application/x-protobuf", {}, BIG, 413, 8,
     "max_body_bytes"),
    ("a chunked body above max_body_bytes", "/v1/logs", "application/json", {},
     iter([b'{"resourceLogs": [], "x": "', b"y" * (70 * KiB), b'"}']), 413, 8, "max_body_bytes"),
    ("gzip above max_decompressed_bytes", "/v1/logs", "application/x-protobuf",
     {"content-encoding": "gzip"}, gzip.compress(BIG), 413, 8, "max_decompressed_bytes"),
    ("bad gzip", "/v1/logs", "application/x-protobuf", {"content-encoding": "gzip"},
     b"\x1f\x8b\x08\x00not gzip at all", 400, 3, "not valid gzip"),
    ("truncated gzip", "/v1/traces", "application/json", {"content-encoding": "gzip"},
     gzip.compress(b'{"resourceSpans": []}')[:-9], 400, 3, "truncated"),
    ("unknown Content-Type", "/v1/logs", "text/plain", {}, b"hello", 415, 3, "text/plain"),
    ("no Content-Type", "/v1/metrics", "", {}, GOOD, 415, 3, "(none)"),
    ("unknown Content-Encoding", "/v1/logs", "application/x-protobuf", {"content-encoding": "br"},
     GOOD, 415, 3, "'br' is not supported"),
    ("a value nested too deep (protobuf)", "/v1/logs", "application/x-protobuf", {},
     deep_log_body(otlp.MAX_DEPTH + 1), 400, 3,
     "nests deeper than 32"),
    ("a value nested too deep (JSON)", "/v1/logs", "application/json", {},
     json_logs({"body": deep_json_array(otlp.MAX_DEPTH + 1)}), 400, 3, "nests deeper than 32"),
    ("a value nested far too deep (protobuf)", "/v1/logs", "application/x-protobuf", {},
     deep_log_body(200), 400, 3,
     "not an OTLP logs request"),
    ("a value nested far too deep (JSON)", "/v1/logs", "application/json", {},
     json_logs({"body": "BODY"}).replace(b'"BODY"', b'{"arrayValue":{"values":[' * 300 +
                                          b'{"stringValue":"bottom"}' + b"]}}" * 300),
     400, 3, "nests too deeply"),
]


@pytest.mark.parametrize("case,path,media,headers,body,status,code,words", BAD, ids=[b[0] for b in BAD])
def test_a_bad_request_is_refused_clearly_and_changes_nothing(
        client: TestClient, data_dir: Path, case: str, path: str, media: str, headers: dict[str, str],
        body: Any, status: int, code: int, words: str) -> None:
    for signal_path in ("/v1/logs", "/v1/traces", "/v1/metrics"):  # something stored already
        good = GOOD if signal_path == "/v1/logs" else b""
        assert client.post(signal_path, content=good, headers=PROTOBUF).status_code == 200
    before = everything(data_dir)
    assert len(before["otel-logs"]) == 3
    r = client.post(path, content=body, headers={**({"content-type": media} if media else {}),
                                                 **headers})
    assert r.status_code == status, r.content
    if status == 200:
        assert r.content == b"{}"
    else:
        got_code, message = status_of(r, media)
        assert got_code == code and words in message, (got_code, message)
        assert "retry-after" not in r.headers  # no point retrying any of these
    assert everything(data_dir) == before


def test_the_nesting_limit_itself_is_accepted(client: TestClient, data_dir: Path) -> None:
    body = deep_log_body(otlp.MAX_DEPTH)
    assert otlp.events("logs", body)[0][0]["body"] == deep_array(otlp.MAX_DEPTH)
    r = client.post("/v1/logs", content=body, headers=PROTOBUF)
    assert r.status_code == 200, r.content
    assert [typed(orjson.loads(e)) for e in stored(data_dir, "otel-logs")] == expected("logs", [body])


def test_a_body_above_the_limit_without_content_length_is_chunked(client: TestClient) -> None:
    """(the chunked case above must really come without Content-Length)"""
    seen: dict[str, str] = {}

    def record(request: Any) -> None:
        seen.update(request.headers)

    client.event_hooks["request"].append(record)
    client.post("/v1/logs", content=iter([b"{}"]), headers=JSON)
    assert "content-length" not in seen and seen.get("transfer-encoding") == "chunked"


# ---- tokens -----------------------------------------------------------------------------

@pytest.mark.parametrize("media", ["application/x-protobuf", "application/json"])
def test_tokens(data_dir: Path, media: str) -> None:
    with TestClient(create_app(config(data_dir, auth="on", tokens=("s3cret-token",)))) as c:
        body = GOOD if media == PROTOBUF["content-type"] else b"{}"
        r = c.post("/v1/logs", content=body, headers={"content-type": media})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert status_of(r, media) == (16, "send 'Authorization: Bearer <token>'")  # UNAUTHENTICATED
        r = c.post("/v1/traces", content=body, headers={"content-type": media,
                                                        "authorization": "Bearer wrong"})
        assert r.status_code == 403
        assert status_of(r, media) == (7, "this token is not accepted")  # PERMISSION_DENIED
        assert everything(data_dir) == {s: [] for s in STREAMS.values()}
        r = c.post("/v1/logs", content=body, headers={"content-type": media,
                                                      "authorization": "Bearer s3cret-token"})
        assert r.status_code == 200
    assert len(stored(data_dir, "otel-logs")) == (3 if media == PROTOBUF["content-type"] else 0)


@pytest.mark.parametrize("media", ["application/x-protobuf", "application/json"])
def test_scoped_tokens_need_write_on_the_configured_stream(data_dir: Path, media: str) -> None:
    """An OTLP path needs write on the stream its signal is configured to go to."""
    tokens = (Token("logs", digest_of(b"l"), write=("otel-logs",)),
              Token("edge", digest_of(b"e"), write=("edge-*",)),
              Token("reader", digest_of(b"r"), read=("*",)))
    cfg = config(data_dir, auth="on", tokens=tokens, otlp_traces_stream="edge-traces")
    body = GOOD if media == PROTOBUF["content-type"] else b"{}"

    def post(signal: str, secret: str, content: bytes = body) -> Any:
        return c.post(f"/v1/{signal}", content=content,
                      headers={"content-type": media, "authorization": f"Bearer {secret}"})

    with TestClient(create_app(cfg)) as c:
        assert post("logs", "l").status_code == 200
        for signal, secret, stream in [("traces", "l", "edge-traces"), ("metrics", "l", "otel-metrics"),
                                       ("logs", "e", "otel-logs"), ("logs", "r", "otel-logs")]:
            r = post(signal, secret)
            name = {"l": "logs", "e": "edge", "r": "reader"}[secret]
            assert r.status_code == 403
            assert status_of(r, media) == (7, f"token {name!r} lacks write on stream {stream!r}")
        r = post("traces", "e", b"" if media == PROTOBUF["content-type"] else b"{}")  # empty
        assert r.status_code == 200, r.content
    assert len(stored(data_dir, "otel-logs")) == (3 if media == PROTOBUF["content-type"] else 0)


# ---- partial success and empty requests -------------------------------------------------

def records_with_bad_ids() -> ExportLogsServiceRequest:
    request = logs_request("partial", [{"body": f"record {i}", "span_id": bytes(8)} for i in range(4)])
    request.resource_logs[0].scope_logs[0].log_records[2].span_id = b"\x01\x02\x03"
    return request


@pytest.mark.parametrize("media", ["application/x-protobuf", "application/json"])
def test_partial_success_stores_the_good_records(client: TestClient, data_dir: Path,
                                                 media: str) -> None:
    request = records_with_bad_ids()
    if media == JSON["content-type"]:
        body = orjson.dumps({"resourceLogs": [{
            "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "partial"}}]},
            "scopeLogs": [{"scope": {"name": "tests"}, "logRecords": [
                {"body": {"stringValue": f"record {i}"},
                 "spanId": "010203" if i == 2 else "0000000000000000"} for i in range(4)]}]}]})
    else:
        body = request.SerializeToString()
    r = client.post("/v1/logs", content=body, headers={"content-type": media})
    assert r.status_code == 200, r.content
    if media == JSON["content-type"]:
        answer = orjson.loads(r.content)["partialSuccess"]
        rejected, message = int(answer["rejectedLogRecords"]), answer["errorMessage"]
    else:
        partial = ExportLogsServiceResponse.FromString(r.content).partial_success
        rejected, message = partial.rejected_log_records, partial.error_message
    assert rejected == 1
    assert "span_id" in message and "3 bytes" in message, message  # names the cause
    got = [orjson.loads(e) for e in stored(data_dir, "otel-logs")]
    assert [e["body"] for e in got] == ["record 0", "record 1", "record 3"]
    assert [typed(e) for e in got] == expected("logs", [request.SerializeToString()])


@pytest.mark.parametrize("signal", ["logs", "traces", "metrics"])
def test_a_request_of_only_bad_records_stores_nothing(client: TestClient, data_dir: Path,
                                                      signal: str) -> None:
    if signal == "logs":
        request: Any = logs_request("bad", [{"trace_id": b"\x01" * 15}, {"span_id": b"\x01" * 9}])
        field = "rejected_log_records"
    elif signal == "traces":
        request = ExportTraceServiceRequest()
        spans = request.resource_spans.add().scope_spans.add().spans
        spans.add(trace_id=b"\x01" * 16, span_id=b"\x01" * 7)
        spans.add(trace_id=b"\x01" * 16, span_id=b"\x01" * 8, parent_span_id=b"\x01")
        spans.add(trace_id=b"\x01" * 16, span_id=b"\x01" * 8).links.add(trace_id=b"\x01" * 3)
        field = "rejected_spans"
    else:
        request = ExportMetricsServiceRequest()
        metric = request.resource_metrics.add().scope_metrics.add().metrics.add(name="m")
        metric.gauge.data_points.add(as_int=1).exemplars.add(span_id=b"\x01" * 4)
        field = "rejected_data_points"
    body = request.SerializeToString()
    events, rejected = otlp.events(signal, body)
    assert events == [] and rejected == {"logs": 2, "traces": 3, "metrics": 1}[signal]
    r = client.post(f"/v1/{signal}", content=body, headers=PROTOBUF)
    assert r.status_code == 200
    partial = RESPONSES[signal].FromString(r.content).partial_success
    assert getattr(partial, field) == rejected
    assert "bytes, not" in partial.error_message, partial.error_message
    assert everything(data_dir) == {s: [] for s in STREAMS.values()}


def test_an_event_above_max_entry_bytes_is_refused_alone(client: TestClient, data_dir: Path) -> None:
    request = logs_request("sizes", [{"body": "small"}, {"body": "x" * (9 * KiB)}, {"body": "small too"}])
    r = client.post("/v1/logs", content=request.SerializeToString(), headers=PROTOBUF)
    assert r.status_code == 200, r.content
    partial = ExportLogsServiceResponse.FromString(r.content).partial_success
    assert partial.rejected_log_records == 1
    assert "max_entry_bytes" in partial.error_message, partial.error_message
    assert [orjson.loads(e)["body"] for e in stored(data_dir, "otel-logs")] == ["small", "small too"]


@pytest.mark.parametrize("signal", ["logs", "traces", "metrics"])
@pytest.mark.parametrize("media", ["application/x-protobuf", "application/json"])
def test_an_empty_request_stores_nothing(client: TestClient, data_dir: Path, signal: str,
                                         media: str) -> None:
    bodies = [b""] if media == PROTOBUF["content-type"] else [b"{}", b'{"resourceLogs": []}']
    # a resource with a scope but no records, and a metric without data points
    empty_groups = {"logs": b'{"resourceLogs": [{"scopeLogs": [{"logRecords": []}]}]}',
                    "traces": b'{"resourceSpans": [{"scopeSpans": [{}]}]}',
                    "metrics": b'{"resourceMetrics": [{"scopeMetrics": [{"metrics": [{"name": "m"}]}]}]}'}
    if media == JSON["content-type"]:
        bodies.append(empty_groups[signal])
    for body in bodies:
        r = client.post(f"/v1/{signal}", content=body, headers={"content-type": media})
        assert r.status_code == 200, r.content
        assert r.headers["content-type"] == media
        assert r.content == (b"" if media == PROTOBUF["content-type"] else b"{}")
    assert everything(data_dir) == {s: [] for s in STREAMS.values()}


# ---- the JSON encoding ------------------------------------------------------------------

RESOURCE = {"attributes": [{"key": "service.name", "value": {"stringValue": "json-svc"}}],
            "droppedAttributesCount": 1, "aFieldFromTheFuture": {"nested": [1, 2]}}
SCOPE = {"name": "lib", "version": "1.2", "attributes": [{"key": "k", "value": {"intValue": "1"}}],
         "droppedAttributesCount": 2}
# Every AnyValue kind, 64-bit integers as strings and as numbers, and a value with no kind.
ANY_VALUES = [
    {"key": "string", "value": {"stringValue": "héllo \u2603"}},
    {"key": "bool", "value": {"boolValue": True}},
    {"key": "int as string", "value": {"intValue": "-9223372036854775808"}},
    {"key": "int as number", "value": {"intValue": 9007199254740993}},
    {"key": "double", "value": {"doubleValue": 637.704}},
    {"key": "integral double", "value": {"doubleValue": 5}},
    {"key": "NaN", "value": {"doubleValue": "NaN"}},
    {"key": "-Infinity", "value": {"doubleValue": "-Infinity"}},
    {"key": "bytes", "value": {"bytesValue": "AAEC/w=="}},
    {"key": "array", "value": {"arrayValue": {"values": [{"stringValue": "a"}, {"intValue": 2},
                                                         {"arrayValue": {}}, {}]}}},
    {"key": "map", "value": {"kvlistValue": {"values": [{"key": "inner", "value": {"kvlistValue": {
        "values": [{"key": "x", "value": {"boolValue": False}}]}}}]}}},
    {"key": "empty", "value": {}},
]
PY_VALUES: dict[str, Any] = {
    "string": "héllo \u2603", "bool": True, "int as string": -(2**63),
    "int as number": 9007199254740993, "double": 637.704, "integral double": 5.0,
    "NaN": float("nan"), "-Infinity": float("-inf"), "bytes": b"\x00\x01\x02\xff",
    "array": ["a", 2, [], None], "map": {"inner": {"x": False}}, "empty": None,
}
TRACE_ID, SPAN_ID, PARENT_ID = "5B8EFFF798038103D269B633813FC60C", "EEE19B7EC3C1B174", "eee19b7ec3c1b173"


def resource_and_scope(group: Any, scope_group: Any) -> None:
    group.resource.attributes.extend(key_values({"service.name": "json-svc"}))
    group.resource.dropped_attributes_count = 1
    scope_group.scope.name, scope_group.scope.version = "lib", "1.2"
    scope_group.scope.attributes.extend(key_values({"k": 1}))
    scope_group.scope.dropped_attributes_count = 2


def json_and_protobuf_logs() -> tuple[Any, bytes]:
    document = {"resourceLogs": [{"resource": RESOURCE, "schemaUrl": "https://example.com/r", "scopeLogs": [{
        "scope": SCOPE, "schemaUrl": "https://example.com/s", "logRecords": [{
            "timeUnixNano": "1544712660300000000", "observedTimeUnixNano": 1544712660300000001,
            "severityNumber": 10, "severityText": "Information", "traceId": TRACE_ID,
            "spanId": SPAN_ID.lower(), "flags": 769, "eventName": "an.event",
            "body": {"kvlistValue": {"values": ANY_VALUES}}, "attributes": ANY_VALUES,
            "droppedAttributesCount": 3, "unknownField": "ignored",
        }, {"body": {"stringValue": "defaults"}}]}]}]}
    request = ExportLogsServiceRequest()
    group = request.resource_logs.add(schema_url="https://example.com/r")
    scope_group = group.scope_logs.add(schema_url="https://example.com/s")
    resource_and_scope(group, scope_group)
    record = scope_group.log_records.add(
        time_unix_nano=1544712660300000000, observed_time_unix_nano=1544712660300000001,
        severity_number=10, severity_text="Information", trace_id=bytes.fromhex(TRACE_ID),
        span_id=bytes.fromhex(SPAN_ID), flags=769, event_name="an.event", dropped_attributes_count=3)
    record.body.kvlist_value.values.extend(key_values(PY_VALUES))
    record.attributes.extend(key_values(PY_VALUES))
    scope_group.log_records.add().body.string_value = "defaults"
    return document, request.SerializeToString()


def json_and_protobuf_traces() -> tuple[Any, bytes]:
    document = {"resourceSpans": [{"resource": RESOURCE, "scopeSpans": [{"scope": SCOPE, "spans": [{
        "traceId": TRACE_ID, "spanId": SPAN_ID, "parentSpanId": PARENT_ID, "traceState": "a=b",
        "flags": 257, "name": "I'm a server span", "kind": 2,
        "startTimeUnixNano": 1544712660000000000, "endTimeUnixNano": "1544712661000000000",
        "attributes": ANY_VALUES[:5], "droppedAttributesCount": 1,
        "events": [{"timeUnixNano": "1544712660500000000", "name": "an event",
                    "attributes": [{"key": "e", "value": {"boolValue": True}}],
                    "droppedAttributesCount": 4},
                   {"name": "bare"}],
        "droppedEventsCount": 5,
        "links": [{"traceId": TRACE_ID.lower(), "spanId": "0000000000000001", "traceState": "x=y",
                   "attributes": [{"key": "l", "value": {"doubleValue": 0.5}}],
                   "droppedAttributesCount": 6, "flags": 256}],
        "droppedLinksCount": 7,
        "status": {"code": 2, "message": "it broke"},
        "aFutureField": [{"traceId": "0102"}]}]}]}]}  # unknown: ignored (its "id" is hex)
    request = ExportTraceServiceRequest()
    group = request.resource_spans.add()
    scope_group = group.scope_spans.add()
    resource_and_scope(group, scope_group)
    span = scope_group.spans.add(
        trace_id=bytes.fromhex(TRACE_ID), span_id=bytes.fromhex(SPAN_ID),
        parent_span_id=bytes.fromhex(PARENT_ID), trace_state="a=b", flags=257,
        name="I'm a server span", kind=Span.SPAN_KIND_SERVER,
        start_time_unix_nano=1544712660000000000, end_time_unix_nano=1544712661000000000,
        dropped_attributes_count=1, dropped_events_count=5, dropped_links_count=7)
    span.attributes.extend(key_values(dict(list(PY_VALUES.items())[:5])))
    event = span.events.add(time_unix_nano=1544712660500000000, name="an event",
                            dropped_attributes_count=4)
    event.attributes.extend(key_values({"e": True}))
    span.events.add(name="bare")
    link = span.links.add(trace_id=bytes.fromhex(TRACE_ID), span_id=bytes.fromhex("0000000000000001"),
                          trace_state="x=y", dropped_attributes_count=6, flags=256)
    link.attributes.extend(key_values({"l": 0.5}))
    span.status.CopyFrom(SpanStatus(code=SpanStatus.STATUS_CODE_ERROR, message="it broke"))
    return document, request.SerializeToString()


def json_and_protobuf_metrics() -> tuple[Any, bytes]:
    exemplar = {"filteredAttributes": [{"key": "f", "value": {"stringValue": "v"}}],
                "timeUnixNano": "1544712660300000000", "asDouble": 1.5, "spanId": SPAN_ID,
                "traceId": TRACE_ID}
    attrs = [{"key": "a", "value": {"stringValue": "b"}}]
    t0, t1 = "1544712660300000000", 1544712661300000000
    document = {"resourceMetrics": [{"resource": RESOURCE, "scopeMetrics": [{"scope": SCOPE, "metrics": [
        {"name": "gauge", "unit": "1", "description": "a gauge",
         "metadata": [{"key": "m", "value": {"stringValue": "meta"}}],
         "gauge": {"dataPoints": [{"asDouble": 10, "timeUnixNano": t1, "attributes": attrs},
                                  {"asInt": "-7", "timeUnixNano": t1, "flags": 1}]}},
        {"name": "sum", "sum": {"aggregationTemporality": 2, "isMonotonic": True, "dataPoints": [
            {"asInt": 9007199254740993, "startTimeUnixNano": t0, "timeUnixNano": t1,
             "exemplars": [exemplar, {"asInt": "3"}]}]}},
        {"name": "histogram", "histogram": {"aggregationTemporality": 1, "dataPoints": [
            {"startTimeUnixNano": t0, "timeUnixNano": t1, "count": "6", "sum": 12.5,
             "bucketCounts": ["1", 2, "3"], "explicitBounds": [1, 2.5], "min": 0.5, "max": 4,
             "exemplars": [exemplar]},
            {"count": 0, "bucketCounts": [], "explicitBounds": []}]}},  # no sum, min, max
        {"name": "exponential", "exponentialHistogram": {"aggregationTemporality": 2, "dataPoints": [
            {"startTimeUnixNano": t0, "timeUnixNano": t1, "count": "10", "sum": 40.25, "scale": -3,
             "zeroCount": "1", "zeroThreshold": 1e-9,
             "positive": {"offset": -2, "bucketCounts": ["4", 3]},
             "negative": {"offset": 1, "bucketCounts": [2]}, "min": -8, "max": 20}]}},
        {"name": "summary", "summary": {"dataPoints": [
            {"startTimeUnixNano": t0, "timeUnixNano": t1, "count": "3", "sum": 6,
             "quantileValues": [{"quantile": 0, "value": 1}, {"quantile": 0.5, "value": 2},
                                {"quantile": 1, "value": 3}]}]}},
    ]}]}]}
    request = ExportMetricsServiceRequest()
    group = request.resource_metrics.add()
    scope_group = group.scope_metrics.add()
    resource_and_scope(group, scope_group)
    T0, T1 = int(t0), t1

    def add_exemplar(point: Any) -> None:
        e = point.exemplars.add(time_unix_nano=T0, as_double=1.5, span_id=bytes.fromhex(SPAN_ID),
                                trace_id=bytes.fromhex(TRACE_ID))
        e.filtered_attributes.extend(key_values({"f": "v"}))

    gauge = scope_group.metrics.add(name="gauge", unit="1", description="a gauge")
    gauge.metadata.extend(key_values({"m": "meta"}))
    gauge.gauge.data_points.add(as_double=10, time_unix_nano=T1).attributes.extend(key_values({"a": "b"}))
    gauge.gauge.data_points.add(as_int=-7, time_unix_nano=T1, flags=1)
    sum_ = scope_group.metrics.add(name="sum")
    sum_.sum.aggregation_temporality, sum_.sum.is_monotonic = CUMULATIVE, True
    number = sum_.sum.data_points.add(as_int=9007199254740993, start_time_unix_nano=T0, time_unix_nano=T1)
    add_exemplar(number)
    number.exemplars.add(as_int=3)
    histogram = scope_group.metrics.add(name="histogram")
    histogram.histogram.aggregation_temporality = DELTA
    bars = histogram.histogram.data_points.add(start_time_unix_nano=T0, time_unix_nano=T1, count=6,
                                               sum=12.5, bucket_counts=[1, 2, 3],
                                               explicit_bounds=[1, 2.5], min=0.5, max=4)
    add_exemplar(bars)
    histogram.histogram.data_points.add()
    exponential = scope_group.metrics.add(name="exponential")
    exponential.exponential_histogram.aggregation_temporality = CUMULATIVE
    buckets = exponential.exponential_histogram.data_points.add(
        start_time_unix_nano=T0, time_unix_nano=T1, count=10, sum=40.25, scale=-3, zero_count=1,
        zero_threshold=1e-9, min=-8, max=20)
    buckets.positive.offset, buckets.negative.offset = -2, 1
    buckets.positive.bucket_counts.extend([4, 3])
    buckets.negative.bucket_counts.append(2)
    summary = scope_group.metrics.add(name="summary")
    quantiles = summary.summary.data_points.add(start_time_unix_nano=T0, time_unix_nano=T1, count=3,
                                                sum=6)
    for q, v in ((0, 1), (0.5, 2), (1, 3)):
        quantiles.quantile_values.add(quantile=q, value=v)
    return document, request.SerializeToString()


BUILDERS = {"logs": json_and_protobuf_logs, "traces": json_and_protobuf_traces,
            "metrics": json_and_protobuf_metrics}


@pytest.mark.parametrize("signal", ["logs", "traces", "metrics"])
def test_json_stores_what_the_protobuf_of_the_same_request_stores(client: TestClient,
                                                                  data_dir: Path, signal: str) -> None:
    document, protobuf = BUILDERS[signal]()
    reference = expected(signal, [protobuf])
    assert otlp.events(signal, protobuf)[1] == 0 and reference
    r = client.post(f"/v1/{signal}", content=orjson.dumps(document), headers=JSON)
    assert r.status_code == 200 and r.content == b"{}", r.content
    from_json = stored(data_dir, STREAMS[signal])
    assert [typed(orjson.loads(e)) for e in from_json] == reference
    r = client.post(f"/v1/{signal}", content=protobuf, headers=PROTOBUF)
    assert r.status_code == 200 and r.content == b"", r.content
    both = stored(data_dir, STREAMS[signal])
    assert len(both) == 2 * len(from_json)
    assert both == from_json * 2  # byte for byte (one service: one shard, in order)


def test_json_fields_as_documented(client: TestClient, data_dir: Path) -> None:
    """A few values of the JSON requests above, as literals (not only as the
    reference reads the protobuf): ids in lowercase hex, integers exact."""
    for signal, builder in BUILDERS.items():
        r = client.post(f"/v1/{signal}", content=orjson.dumps(builder()[0]), headers=JSON)
        assert r.status_code == 200, r.content
    log, defaults = [orjson.loads(e) for e in stored(data_dir, "otel-logs")]
    assert log["trace_id"] == TRACE_ID.lower() and log["span_id"] == SPAN_ID.lower()
    assert log["time_unix_nano"] == 1544712660300000000 and log["severity_number"] == 10
    assert log["attributes"]["int as string"] == -(2**63)
    assert log["attributes"]["int as number"] == 9007199254740993
    assert typed(log["attributes"]["integral double"]) == ("float", 5.0)
    assert log["attributes"]["NaN"] == "NaN" and log["attributes"]["bytes"] == "AAEC/w=="
    assert log["value_types"]["/attributes/NaN"] == "double"
    assert log["value_types"]["/body/bytes"] == "bytes"
    assert log["body"]["array"] == ["a", 2, [], None] and log["attributes"]["empty"] is None
    assert log["resource"] == {"attributes": {"service.name": "json-svc"},
                               "dropped_attributes_count": 1, "schema_url": "https://example.com/r"}
    assert defaults["body"] == "defaults" and defaults["trace_id"] == "" and defaults["flags"] == 0
    (span,) = [orjson.loads(e) for e in stored(data_dir, "otel-traces")]
    assert span["kind"] == 2 and span["parent_span_id"] == PARENT_ID
    assert span["links"][0]["trace_id"] == TRACE_ID.lower() and span["links"][0]["flags"] == 256
    assert span["status"] == {"code": 2, "message": "it broke"} and span["dropped_links_count"] == 7
    assert [e["name"] for e in span["events"]] == ["an event", "bare"]
    points: dict[str, Any] = {}
    for e in stored(data_dir, "otel-metrics"):  # the first point of each metric
        points.setdefault(orjson.loads(e)["metric"]["name"], orjson.loads(e))
    assert points["sum"]["value"] == 9007199254740993
    assert points["sum"]["exemplars"][0]["trace_id"] == TRACE_ID.lower()
    assert points["histogram"]["bucket_counts"] == [1, 2, 3] and points["histogram"]["count"] == 6
    assert points["exponential"]["positive"] == {"offset": -2, "bucket_counts": [4, 3]}
    assert points["summary"]["quantile_values"][1] == {"quantile": 0.5, "value": 2.0}


@pytest.mark.parametrize("name", ["traceId", "spanId", "parentSpanId"])
def test_json_ids_in_either_case_and_in_snake_case(client: TestClient, data_dir: Path,
                                                   name: str) -> None:
    size = 32 if name == "traceId" else 16
    for case, value in (("lower", "ab" * (size // 2)), ("upper", "AB" * (size // 2)),
                        ("mixed", "aB" * (size // 2))):
        for key in (name, {"traceId": "trace_id", "spanId": "span_id",
                           "parentSpanId": "parent_span_id"}[name]):
            body = orjson.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [{key: value,
                                                                               "name": case}]}]}]})
            assert client.post("/v1/traces", content=body, headers=JSON).status_code == 200
    spans = [orjson.loads(e) for e in stored(data_dir, "otel-traces")]
    field = {"traceId": "trace_id", "spanId": "span_id", "parentSpanId": "parent_span_id"}[name]
    assert [s[field] for s in spans] == ["ab" * (size // 2)] * 6


def test_json_ids_inside_unknown_fields_are_ignored(client: TestClient, data_dir: Path) -> None:
    """Unknown fields are ignored, whatever they hold: an object with a
    traceId that is not hex among them is no reason to refuse the request."""
    body = orjson.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": [
        {"body": {"stringValue": "kept"}, "futureField": {"traceId": "not hex at all"}}]}],
        "futureGroup": [{"spanId": "zz"}]}], "extra": {"traceId": "??"}})
    r = client.post("/v1/logs", content=body, headers=JSON)
    assert r.status_code == 200 and r.content == b"{}", r.content
    (event,) = [orjson.loads(e) for e in stored(data_dir, "otel-logs")]
    assert event["body"] == "kept" and event["trace_id"] == ""


def test_events_far_larger_than_the_body_are_refused_whole(client: TestClient, data_dir: Path) -> None:
    """Each event repeats its resource: 2,000 empty records under a 1 KB
    service.name are a 9 KB body and 2.3 MB of events, above
    max_decompressed_bytes (256 KiB here): 413, nothing stored."""
    body = logs_request("s" * 1000, [{}] * 2000).SerializeToString()
    assert len(body) < LIMITS["max_body_bytes"]  # type: ignore[operator]
    r = client.post("/v1/logs", content=body, headers=PROTOBUF)
    assert r.status_code == 413
    assert status_of(r, PROTOBUF["content-type"]) == (
        8, f"the events of this OTLP request take more than {256 * KiB} bytes")
    assert everything(data_dir) == {s: [] for s in STREAMS.values()}
