"""OTLP export requests that use every part of the event layout
(tests/support/otlp.py): attributes of every type (bytes, non-finite
doubles, arrays, nested maps), bodies of every kind, span events and links,
and every metric type, integer and double points, exemplars."""

from __future__ import annotations

import math
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.metrics.v1.metrics_pb2 import (AGGREGATION_TEMPORALITY_CUMULATIVE,
                                                        AGGREGATION_TEMPORALITY_DELTA)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from .otlp_http import any_value, key_values

T0_NS = 1_763_700_000_123_456_789
"""2025-11-21T04:40:00.123456789Z: nanoseconds a microsecond timestamp cannot hold."""


EVERY_TYPE: dict[str, Any] = {
    "s": "text", "empty": "", "b": True, "i": -42, "big": (1 << 63) - 1, "d": 2.5, "whole": 3.0,
    "nan": math.nan, "inf": math.inf, "ninf": -math.inf, "raw": b"\x00\xff\x10",
    "list": [1, "two", 3.5, False, None, b"\x01"], "map": {"k": "v", "n": {"deep": [1, {"x": None}]}},
    "unset": None, "uni": "h\u00e9 \u2603 \"q\"",
}

RESOURCE = {"service.name": "checkout", "host.id": 7, "tags": ["a", "b"]}
SCOPE = {"lib.flag": True}


def logs_request() -> ExportLogsServiceRequest:
    req = ExportLogsServiceRequest()
    rl = req.resource_logs.add(schema_url="https://opentelemetry.io/schemas/1.30.0")
    rl.resource.attributes.extend(key_values(RESOURCE))
    rl.resource.dropped_attributes_count = 2
    ref = rl.resource.entity_refs.add(schema_url="s", type="host", id_keys=["host.id"])
    ref.description_keys.append("host.name")
    sl = rl.scope_logs.add(schema_url="scope-schema")
    sl.scope.name, sl.scope.version = "app.logger", "1.2.3"
    sl.scope.attributes.extend(key_values(SCOPE))
    sl.scope.dropped_attributes_count = 1
    bodies: list[Any] = ["plain text", 17, 2.25, True, ["x", 1], {"msg": "hi", "n": {"m": [1.5]}},
                         b"\xde\xad", math.nan, None, ""]
    for i, body in enumerate(bodies):
        record = sl.log_records.add(
            time_unix_nano=T0_NS + i, observed_time_unix_nano=0 if i % 2 else T0_NS + 1000 + i,
            severity_number=9 + i % 4, severity_text="INFO", flags=0x01 if i % 3 else 0xFFFFFFFF,
            trace_id=bytes(range(16)) if i % 2 == 0 else b"", span_id=bytes(range(8, 16)) if i % 2 == 0 else b"",
            event_name="app.event" if i == 0 else "", dropped_attributes_count=i)
        if body is not None:
            record.body.CopyFrom(any_value(body))
        record.attributes.extend(key_values(EVERY_TYPE if i == 0 else {"i": i}))
    req.resource_logs.add().scope_logs.add().log_records.add(time_unix_nano=0)  # all empty
    return req


def traces_request() -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.extend(key_values(RESOURCE))
    ss = rs.scope_spans.add()
    ss.scope.name = "tracer"
    for i in range(3):
        span = ss.spans.add(
            trace_id=bytes([i] * 16), span_id=bytes([i + 1] * 8), trace_state="k=v",
            parent_span_id=bytes([9] * 8) if i else b"", flags=0x301, name=f"span-{i}",
            kind=[Span.SPAN_KIND_INTERNAL, Span.SPAN_KIND_SERVER, Span.SPAN_KIND_CLIENT][i],
            start_time_unix_nano=T0_NS, end_time_unix_nano=T0_NS + 1_234_567_891 * i if i else 0,
            dropped_attributes_count=i, dropped_events_count=i, dropped_links_count=2 * i)
        span.attributes.extend(key_values(EVERY_TYPE if i == 0 else {"http.status": 200 + i}))
        for j in range(i):
            event = span.events.add(time_unix_nano=T0_NS + 5 + j, name=f"ev-{j}", dropped_attributes_count=j)
            event.attributes.extend(key_values({"exception.type": "E", "n": j, "raw": b"\x07"}))
        for j in range(i):
            link = span.links.add(trace_id=bytes([7] * 16), span_id=bytes([8] * 8), trace_state="",
                                  flags=j, dropped_attributes_count=3)
            link.attributes.extend(key_values({"link.n": j, "d": -math.inf}))
        span.status.code = [Status.STATUS_CODE_UNSET, Status.STATUS_CODE_OK, Status.STATUS_CODE_ERROR][i]
        span.status.message = "bad" if i == 2 else ""
    return req


def metrics_request() -> ExportMetricsServiceRequest:
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    rm.resource.attributes.extend(key_values(RESOURCE))
    sm = rm.scope_metrics.add()
    sm.scope.name = "meter"
    gauge = sm.metrics.add(name="temp", description="temperature", unit="Cel")
    gauge.metadata.extend(key_values({"origin": "sensor", "rev": 3}))
    for i, v in enumerate([21.5, -7, math.nan, (1 << 63) - 1, 2.0]):
        p = gauge.gauge.data_points.add(time_unix_nano=T0_NS + i, start_time_unix_nano=0, flags=i % 2)
        p.attributes.extend(key_values({"room": f"r{i}"}))
        if isinstance(v, int):
            p.as_int = v
        else:
            p.as_double = v
    total = sm.metrics.add(name="requests", unit="1")
    total.sum.aggregation_temporality, total.sum.is_monotonic = AGGREGATION_TEMPORALITY_CUMULATIVE, True
    p = total.sum.data_points.add(start_time_unix_nano=T0_NS - 10**9, time_unix_nano=T0_NS, as_int=12345)
    ex = p.exemplars.add(time_unix_nano=T0_NS - 7, as_int=3, span_id=bytes([1] * 8), trace_id=bytes([2] * 16))
    ex.filtered_attributes.extend(key_values({"user": "u1", "raw": b"\x00"}))
    p.exemplars.add(time_unix_nano=0, as_double=math.inf)
    histogram = sm.metrics.add(name="latency", unit="ms")
    histogram.histogram.aggregation_temporality = AGGREGATION_TEMPORALITY_DELTA
    hp = histogram.histogram.data_points.add(time_unix_nano=T0_NS, count=6, sum=12.5, min=0.5, max=7.0,
                                             bucket_counts=[1, 2, 3], explicit_bounds=[1.0, 5.0])
    hp.exemplars.add(time_unix_nano=T0_NS + 1, as_double=0.75)
    histogram.histogram.data_points.add(time_unix_nano=T0_NS + 1, count=0)  # no sum, min, max
    expo = sm.metrics.add(name="size", unit="By")
    expo.exponential_histogram.aggregation_temporality = AGGREGATION_TEMPORALITY_CUMULATIVE
    expo.exponential_histogram.data_points.add(
        time_unix_nano=T0_NS, count=9, sum=100.0, scale=-2, zero_count=1, zero_threshold=1e-9,
        positive={"offset": -3, "bucket_counts": [4, 0, 2]}, negative={"offset": 1, "bucket_counts": [2]},
        min=-4.0, max=60.0)
    summary = sm.metrics.add(name="rtt", unit="s")
    sp = summary.summary.data_points.add(time_unix_nano=T0_NS, count=4, sum=math.inf)
    for q, v in [(0.0, 0.1), (0.5, 0.2), (1.0, math.nan)]:
        sp.quantile_values.add(quantile=q, value=v)
    return req


REQUESTS = {"logs": logs_request, "traces": traces_request, "metrics": metrics_request}
