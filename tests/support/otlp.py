"""The reference of the OTLP event layout (docs/opentelemetry.md), on the
official packages: protobuf (upb) decodes, this module turns the messages into
events and back.

It is the oracle of the differential tests of the gateway's decoder
(storage_c/src/codec/otlp.c), which does the same in one pass over the wire format:
for any body, both refuse it or both give the same events.  The way back
(events to an export request) shows that the layout loses nothing.
"""

from __future__ import annotations

import base64
import math
from functools import partial
from typing import Any, Callable, Iterable, Iterator

import orjson
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

Event = dict[str, Any]

REQUESTS: dict[str, type[Message]] = {
    "logs": ExportLogsServiceRequest,
    "traces": ExportTraceServiceRequest,
    "metrics": ExportMetricsServiceRequest,
}

# A record whose ids have another length is refused (partial success).
TRACE_ID_BYTES = 16
SPAN_ID_BYTES = 8
MAX_DEPTH = 32  # nesting of arrays and maps inside one attribute value or body


class Refused(Exception):
    """The whole request is refused (400)."""


class Rejected(Exception):
    """One record is refused; the others are stored (partial success)."""


def decode(signal: str, body: bytes) -> Message:
    try:
        return REQUESTS[signal].FromString(body)
    except DecodeError as exc:
        raise Refused(f"malformed protobuf: {exc}") from None


def events(signal: str, body: bytes) -> tuple[list[Event], int]:
    """The events of one export request and the number of records refused."""
    request = decode(signal, body)
    out: list[Event] = []
    rejected = 0
    for record in RECORDS[signal](request):
        try:
            out.append(record())
        except Rejected:
            rejected += 1
    return out, rejected


def service_name(signal: str, body: bytes) -> str | None:
    """The partition key: service.name of the request's first resource."""
    request = decode(signal, body)
    for resource_group in getattr(request, FIELDS[signal][0]):
        for kv in resource_group.resource.attributes:
            if kv.key == "service.name" and kv.value.WhichOneof("value") == "string_value":
                return str(kv.value.string_value)
        return None
    return None


# ---- values -----------------------------------------------------------

class Path:
    """Where a value sits in its event, as a JSON pointer (RFC 6901), and the
    event's ``value_types``: the values JSON alone cannot type (bytes as
    base64, a double that is not finite)."""

    def __init__(self, types: dict[str, str], pointer: str = "") -> None:
        self.types = types
        self.pointer = pointer

    def child(self, name: str | int) -> Path:
        token = str(name).replace("~", "~0").replace("/", "~1")
        return Path(self.types, f"{self.pointer}/{token}")


def double(x: float) -> float | str:
    if math.isfinite(x):
        return x
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")


def any_value(value: AnyValue, path: Path, depth: int = 0) -> Any:
    if depth > MAX_DEPTH:
        raise Refused(f"a value nests deeper than {MAX_DEPTH} levels")
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "int_value":
        return value.int_value
    if kind == "double_value":
        x = value.double_value
        if not math.isfinite(x):
            path.types[path.pointer] = "double"
        return double(x)
    if kind == "bytes_value":
        path.types[path.pointer] = "bytes"
        return base64.b64encode(value.bytes_value).decode("ascii")
    if kind == "array_value":
        return [any_value(v, path.child(i), depth + 1) for i, v in enumerate(value.array_value.values)]
    if kind == "kvlist_value":
        return attributes(value.kvlist_value.values, path, depth + 1)
    raise Refused("string_value_strindex refers to a dictionary only profiles have")


def attributes(kvs: Iterable[KeyValue], path: Path, depth: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in kvs:
        if kv.key_strindex:
            raise Refused("key_strindex refers to a dictionary only profiles have")
        # A repeated key (OTLP forbids them) is stored as sent; JSON readers keep the last.
        out[kv.key] = any_value(kv.value, path.child(kv.key), depth)
    return out


def hex_id(value: bytes, size: int, what: str) -> str:
    if len(value) not in (0, size):
        raise Rejected(f"{what} has {len(value)} bytes, not {size}")
    return value.hex()


def with_dropped(obj: Event, count: int, name: str = "dropped_attributes_count") -> Event:
    if count:
        obj[name] = count
    return obj


def resource_of(resource: Resource, schema_url: str, path: Path) -> Event:
    out = with_dropped({"attributes": attributes(resource.attributes, path.child("attributes"))},
                       resource.dropped_attributes_count)
    if resource.entity_refs:
        out["entity_refs"] = [{"schema_url": e.schema_url, "type": e.type, "id_keys": list(e.id_keys),
                               "description_keys": list(e.description_keys)}
                              for e in resource.entity_refs]
    if schema_url:
        out["schema_url"] = schema_url
    return out


def scope_of(scope: InstrumentationScope, schema_url: str, path: Path) -> Event:
    out = with_dropped({"name": scope.name, "version": scope.version,
                        "attributes": attributes(scope.attributes, path.child("attributes"))},
                       scope.dropped_attributes_count)
    if schema_url:
        out["schema_url"] = schema_url
    return out


def start(resource_group: Any, scope_group: Any, types: dict[str, str]) -> Event:
    root = Path(types)
    return {"resource": resource_of(resource_group.resource, resource_group.schema_url,
                                    root.child("resource")),
            "scope": scope_of(scope_group.scope, scope_group.schema_url, root.child("scope"))}


def finish(event: Event, types: dict[str, str]) -> Event:
    if types:
        event["value_types"] = dict(sorted(types.items()))
    return event


# ---- logs -------------------------------------------------------------

def log_event(rl: Any, sl: Any, record: Any) -> Event:
    types: dict[str, str] = {}
    root = Path(types)
    event = start(rl, sl, types)
    event.update({
        "time_unix_nano": record.time_unix_nano,
        "observed_time_unix_nano": record.observed_time_unix_nano,
        "severity_number": record.severity_number,
        "severity_text": record.severity_text,
        "body": any_value(record.body, root.child("body")) if record.HasField("body") else None,
        "attributes": attributes(record.attributes, root.child("attributes")),
    })
    with_dropped(event, record.dropped_attributes_count)
    event.update({
        "flags": record.flags,
        "trace_id": hex_id(record.trace_id, TRACE_ID_BYTES, "trace_id"),
        "span_id": hex_id(record.span_id, SPAN_ID_BYTES, "span_id"),
        "event_name": record.event_name,
    })
    return finish(event, types)


def log_records(request: Any) -> Iterator[Callable[[], Event]]:
    for rl in request.resource_logs:
        for sl in rl.scope_logs:
            for record in sl.log_records:
                yield partial(log_event, rl, sl, record)


# ---- traces -----------------------------------------------------------

def span_event(rs: Any, ss: Any, span: Any) -> Event:
    types: dict[str, str] = {}
    root = Path(types)
    event = start(rs, ss, types)
    event.update({
        "trace_id": hex_id(span.trace_id, TRACE_ID_BYTES, "trace_id"),
        "span_id": hex_id(span.span_id, SPAN_ID_BYTES, "span_id"),
        "trace_state": span.trace_state,
        "parent_span_id": hex_id(span.parent_span_id, SPAN_ID_BYTES, "parent_span_id"),
        "flags": span.flags,
        "name": span.name,
        "kind": span.kind,
        "start_time_unix_nano": span.start_time_unix_nano,
        "end_time_unix_nano": span.end_time_unix_nano,
        "attributes": attributes(span.attributes, root.child("attributes")),
    })
    with_dropped(event, span.dropped_attributes_count)
    event["events"] = [
        with_dropped({"time_unix_nano": e.time_unix_nano, "name": e.name,
                      "attributes": attributes(e.attributes, root.child("events").child(i).child("attributes"))},
                     e.dropped_attributes_count)
        for i, e in enumerate(span.events)]
    with_dropped(event, span.dropped_events_count, "dropped_events_count")
    links = []
    for i, link in enumerate(span.links):
        item = {"trace_id": hex_id(link.trace_id, TRACE_ID_BYTES, "a link's trace_id"),
                "span_id": hex_id(link.span_id, SPAN_ID_BYTES, "a link's span_id"),
                "trace_state": link.trace_state,
                "attributes": attributes(link.attributes, root.child("links").child(i).child("attributes"))}
        with_dropped(item, link.dropped_attributes_count)
        item["flags"] = link.flags
        links.append(item)
    event["links"] = links
    with_dropped(event, span.dropped_links_count, "dropped_links_count")
    event["status"] = {"code": span.status.code, "message": span.status.message}
    return finish(event, types)


def spans(request: Any) -> Iterator[Callable[[], Event]]:
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                yield partial(span_event, rs, ss, span)


# ---- metrics ----------------------------------------------------------

METRIC_TYPES = ("gauge", "sum", "histogram", "exponential_histogram", "summary")


def number(point: Any) -> int | float | str | None:
    kind = point.WhichOneof("value")
    if kind == "as_int":
        return int(point.as_int)
    if kind == "as_double":
        return double(point.as_double)
    return None


def optional_double(point: Any, name: str) -> float | str | None:
    return double(getattr(point, name)) if point.HasField(name) else None


def exemplars(point: Any, path: Path) -> list[Event]:
    return [{"filtered_attributes": attributes(e.filtered_attributes,
                                               path.child(i).child("filtered_attributes")),
             "time_unix_nano": e.time_unix_nano,
             "value": number(e),
             "span_id": hex_id(e.span_id, SPAN_ID_BYTES, "an exemplar's span_id"),
             "trace_id": hex_id(e.trace_id, TRACE_ID_BYTES, "an exemplar's trace_id")}
            for i, e in enumerate(point.exemplars)]


def point_event(rm: Any, sm: Any, metric: Any, kind: str, point: Any) -> Event:
    types: dict[str, str] = {}
    root = Path(types)
    event = start(rm, sm, types)
    data = getattr(metric, kind)
    described: Event = {"name": metric.name, "description": metric.description,
                        "unit": metric.unit, "type": kind}
    if kind in ("sum", "histogram", "exponential_histogram"):
        described["aggregation_temporality"] = data.aggregation_temporality
    if kind == "sum":
        described["is_monotonic"] = data.is_monotonic
    if metric.metadata:
        described["metadata"] = attributes(metric.metadata, root.child("metric").child("metadata"))
    event["metric"] = described
    event.update({
        "attributes": attributes(point.attributes, root.child("attributes")),
        "start_time_unix_nano": point.start_time_unix_nano,
        "time_unix_nano": point.time_unix_nano,
        "flags": point.flags,
    })
    if kind in ("gauge", "sum"):
        event["value"] = number(point)
    elif kind == "summary":
        event.update({"count": point.count, "sum": double(point.sum),
                      "quantile_values": [{"quantile": double(q.quantile), "value": double(q.value)}
                                          for q in point.quantile_values]})
    else:
        event.update({"count": point.count, "sum": optional_double(point, "sum")})
        if kind == "histogram":
            event.update({"bucket_counts": list(point.bucket_counts),
                          "explicit_bounds": [double(b) for b in point.explicit_bounds]})
        else:
            event.update({
                "scale": point.scale, "zero_count": point.zero_count,
                "zero_threshold": double(point.zero_threshold),
                "positive": {"offset": point.positive.offset,
                             "bucket_counts": list(point.positive.bucket_counts)},
                "negative": {"offset": point.negative.offset,
                             "bucket_counts": list(point.negative.bucket_counts)},
            })
        event.update({"min": optional_double(point, "min"), "max": optional_double(point, "max")})
    if kind != "summary":
        event["exemplars"] = exemplars(point, root.child("exemplars"))
    return finish(event, types)


def data_points(request: Any) -> Iterator[Callable[[], Event]]:
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                if kind is None:
                    continue
                for point in getattr(metric, kind).data_points:
                    yield partial(point_event, rm, sm, metric, kind, point)


RECORDS: dict[str, Callable[[Any], Iterator[Callable[[], Event]]]] = {
    "logs": log_records, "traces": spans, "metrics": data_points}

# The repeated fields from the request down to the records, per signal.
FIELDS = {
    "logs": ("resource_logs", "scope_logs", "log_records"),
    "traces": ("resource_spans", "scope_spans", "spans"),
    "metrics": ("resource_metrics", "scope_metrics", "metrics"),
}


# ---- the way back: events to an export request --------------------------------

def number_back(value: Any) -> float:
    return float(value)  # "NaN", "Infinity" and "-Infinity" included


def any_back(value: Any, pointer: str, types: dict[str, str]) -> AnyValue:
    out = AnyValue()
    kind = types.get(pointer)
    if kind == "bytes":
        out.bytes_value = base64.b64decode(value)
    elif kind == "double" or isinstance(value, float):
        out.double_value = number_back(value)
    elif value is None:
        pass
    elif isinstance(value, bool):
        out.bool_value = value
    elif isinstance(value, int):
        out.int_value = value
    elif isinstance(value, str):
        out.string_value = value
    elif isinstance(value, list):
        out.array_value.SetInParent()
        out.array_value.values.extend(any_back(v, f"{pointer}/{i}", types) for i, v in enumerate(value))
    else:
        out.kvlist_value.SetInParent()
        out.kvlist_value.values.extend(attributes_back(value, pointer, types))
    return out


def attributes_back(obj: dict[str, Any], pointer: str, types: dict[str, str]) -> list[KeyValue]:
    out = []
    for key, value in obj.items():
        token = key.replace("~", "~0").replace("/", "~1")
        kv = KeyValue(key=key)
        item = any_back(value, f"{pointer}/{token}", types)
        if item.WhichOneof("value") is not None:
            kv.value.CopyFrom(item)
        out.append(kv)
    return out


def _fill_resource(group: Any, resource: Event, types: dict[str, str]) -> None:
    group.resource.attributes.extend(attributes_back(resource["attributes"], "/resource/attributes", types))
    group.resource.dropped_attributes_count = resource.get("dropped_attributes_count", 0)
    for ref in resource.get("entity_refs", []):
        group.resource.entity_refs.add(**ref)
    group.schema_url = resource.get("schema_url", "")


def _fill_scope(group: Any, scope: Event, types: dict[str, str]) -> None:
    group.scope.name, group.scope.version = scope["name"], scope["version"]
    group.scope.attributes.extend(attributes_back(scope["attributes"], "/scope/attributes", types))
    group.scope.dropped_attributes_count = scope.get("dropped_attributes_count", 0)
    group.schema_url = scope.get("schema_url", "")


def _fill_log(record: Any, e: Event, types: dict[str, str]) -> None:
    record.time_unix_nano, record.observed_time_unix_nano = e["time_unix_nano"], e["observed_time_unix_nano"]
    record.severity_number, record.severity_text = e["severity_number"], e["severity_text"]
    body = any_back(e["body"], "/body", types)
    if body.WhichOneof("value") is not None:
        record.body.CopyFrom(body)
    record.attributes.extend(attributes_back(e["attributes"], "/attributes", types))
    record.dropped_attributes_count = e.get("dropped_attributes_count", 0)
    record.flags, record.event_name = e["flags"], e["event_name"]
    record.trace_id, record.span_id = bytes.fromhex(e["trace_id"]), bytes.fromhex(e["span_id"])


def _fill_span(span: Any, e: Event, types: dict[str, str]) -> None:
    span.trace_id, span.span_id = bytes.fromhex(e["trace_id"]), bytes.fromhex(e["span_id"])
    span.parent_span_id = bytes.fromhex(e["parent_span_id"])
    span.trace_state, span.flags, span.name, span.kind = e["trace_state"], e["flags"], e["name"], e["kind"]
    span.start_time_unix_nano, span.end_time_unix_nano = e["start_time_unix_nano"], e["end_time_unix_nano"]
    span.attributes.extend(attributes_back(e["attributes"], "/attributes", types))
    span.dropped_attributes_count = e.get("dropped_attributes_count", 0)
    for i, item in enumerate(e["events"]):
        span.events.add(time_unix_nano=item["time_unix_nano"], name=item["name"],
                        attributes=attributes_back(item["attributes"], f"/events/{i}/attributes", types),
                        dropped_attributes_count=item.get("dropped_attributes_count", 0))
    span.dropped_events_count = e.get("dropped_events_count", 0)
    for i, item in enumerate(e["links"]):
        span.links.add(trace_id=bytes.fromhex(item["trace_id"]), span_id=bytes.fromhex(item["span_id"]),
                       trace_state=item["trace_state"], flags=item["flags"],
                       attributes=attributes_back(item["attributes"], f"/links/{i}/attributes", types),
                       dropped_attributes_count=item.get("dropped_attributes_count", 0))
    span.dropped_links_count = e.get("dropped_links_count", 0)
    if e["status"] != {"code": 0, "message": ""}:
        span.status.code, span.status.message = e["status"]["code"], e["status"]["message"]


def _set_number(target: Any, value: Any) -> None:
    if isinstance(value, int) and not isinstance(value, bool):
        target.as_int = value
    elif value is not None:
        target.as_double = number_back(value)


def _fill_point(metric: Any, e: Event, types: dict[str, str]) -> None:
    kind = e["metric"]["type"]
    data = getattr(metric, kind)
    data.SetInParent()
    point = data.data_points.add()
    point.attributes.extend(attributes_back(e["attributes"], "/attributes", types))
    point.start_time_unix_nano, point.time_unix_nano = e["start_time_unix_nano"], e["time_unix_nano"]
    point.flags = e["flags"]
    if kind in ("gauge", "sum"):
        _set_number(point, e["value"])
    elif kind == "summary":
        point.count, point.sum = e["count"], number_back(e["sum"])
        for q in e["quantile_values"]:
            point.quantile_values.add(quantile=number_back(q["quantile"]), value=number_back(q["value"]))
    else:
        point.count = e["count"]
        for name in ("sum", "min", "max"):
            if e[name] is not None:
                setattr(point, name, number_back(e[name]))
        if kind == "histogram":
            point.bucket_counts.extend(e["bucket_counts"])
            point.explicit_bounds.extend(number_back(b) for b in e["explicit_bounds"])
        else:
            point.scale, point.zero_count = e["scale"], e["zero_count"]
            point.zero_threshold = number_back(e["zero_threshold"])
            for side in ("positive", "negative"):
                if e[side] != {"offset": 0, "bucket_counts": []}:
                    getattr(point, side).offset = e[side]["offset"]
                    getattr(point, side).bucket_counts.extend(e[side]["bucket_counts"])
    for i, x in enumerate(e.get("exemplars", [])):
        exemplar = point.exemplars.add(
            time_unix_nano=x["time_unix_nano"], span_id=bytes.fromhex(x["span_id"]),
            trace_id=bytes.fromhex(x["trace_id"]),
            filtered_attributes=attributes_back(x["filtered_attributes"],
                                                f"/exemplars/{i}/filtered_attributes", types))
        _set_number(exemplar, x["value"])


def request_from_events(signal: str, stored: Iterable[Event]) -> Message:
    """The export request the events came from: consecutive events with the
    same resource (and scope, and metric) share one group."""
    request = REQUESTS[signal]()
    resources, scopes, records = FIELDS[signal]
    last: tuple[Any, ...] = ()
    group = scope_group = metric = None
    for e in stored:
        types = e.get("value_types", {})
        resource, scope = e["resource"], e["scope"]
        # A group's identity, as JSON tells it (1.0 is not 1, true is not 1)
        # with its value_types (bytes are not a string).
        heads = [_head(e, part, types) for part in ("resource", "scope", "metric")]
        if not last or last[0] != heads[0]:
            group = getattr(request, resources).add()
            _fill_resource(group, resource, types)
            last = ()
        if not last or last[1] != heads[1]:
            scope_group = getattr(group, scopes).add()
            _fill_scope(scope_group, scope, types)
        if signal == "logs":
            _fill_log(getattr(scope_group, records).add(), e, types)
        elif signal == "traces":
            _fill_span(getattr(scope_group, records).add(), e, types)
        else:
            described = {k: v for k, v in e["metric"].items()}
            if len(last) < 3 or last[2] != heads[2]:
                metric = getattr(scope_group, records).add(
                    name=described["name"], description=described["description"], unit=described["unit"])
                data = getattr(metric, described["type"])
                data.SetInParent()
                if "aggregation_temporality" in described:
                    data.aggregation_temporality = described["aggregation_temporality"]
                if "is_monotonic" in described:
                    data.is_monotonic = described["is_monotonic"]
                if "metadata" in described:
                    metric.metadata.extend(attributes_back(described["metadata"], "/metric/metadata", types))
            _fill_point(metric, e, types)
            last = tuple(heads)
            continue
        last = tuple(heads[:2])
    return request


def _head(event: Event, part: str, types: dict[str, str]) -> bytes:
    return bytes(orjson.dumps([event.get(part), {k: v for k, v in types.items()
                                                 if k.startswith(f"/{part}/")}]))


def normalized(signal: str, body: bytes) -> bytes:
    """A request as its events tell it: groups without records dropped,
    neighbouring groups with equal heads (resource, scope, metric) merged, an
    empty value or message the same as an absent one; as deterministic
    bytes, so that NaNs compare."""
    request = decode(signal, body)
    resources, scopes, records = FIELDS[signal]
    out = REQUESTS[signal]()
    heads: list[bytes] = []
    containers: list[Any] = []

    def container(level: int, head: Message, parent: Any, field: str) -> Any:
        """The group for ``head`` at ``level``: the last one if its head is equal, else a new one."""
        key = bytes(_canonical(head).SerializeToString(deterministic=True))
        if len(heads) > level and heads[level] == key and containers[level] is not None:
            return containers[level]
        del heads[level:], containers[level:]
        made = getattr(parent, field).add()
        made.CopyFrom(head)
        heads.append(key)
        containers.append(made)
        return made

    for group in getattr(request, resources):
        group_head = type(group)()
        group_head.CopyFrom(group)
        group_head.ClearField(scopes)
        for scope_group in getattr(group, scopes):
            scope_head = type(scope_group)()
            scope_head.CopyFrom(scope_group)
            scope_head.ClearField(records)
            for item in getattr(scope_group, records):
                if signal != "metrics":
                    g = container(0, group_head, out, resources)
                    getattr(container(1, scope_head, g, scopes), records).add().CopyFrom(item)
                    continue
                kind = item.WhichOneof("data")
                if kind is None or not getattr(item, kind).data_points:
                    continue
                metric_head = type(item)()
                metric_head.CopyFrom(item)
                getattr(metric_head, kind).ClearField("data_points")
                getattr(metric_head, kind).SetInParent()
                for point in getattr(item, kind).data_points:
                    g = container(0, group_head, out, resources)
                    sg = container(1, scope_head, g, scopes)
                    m = container(2, metric_head, sg, records)
                    getattr(m, kind).data_points.add().CopyFrom(point)
    return bytes(_canonical(out).SerializeToString(deterministic=True))


def rebuilt(signal: str, stored: Iterable[Event]) -> bytes:
    """request_from_events, as normalized() writes a request."""
    return bytes(_canonical(request_from_events(signal, stored)).SerializeToString(deterministic=True))


def has_repeated_keys(message: Message) -> bool:
    """Whether a list of attributes anywhere repeats a key (OTLP forbids it;
    the layout keeps what was sent, so such a request does not round-trip)."""
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        items = value if field.is_repeated else [value]
        if field.is_repeated and field.message_type.full_name == KeyValue.DESCRIPTOR.full_name:
            keys = [kv.key for kv in value]
            if len(set(keys)) < len(keys):
                return True
        if any(has_repeated_keys(item) for item in items):
            return True
    return False


def _canonical(message: Message) -> Message:
    """Clears empty values and messages (unset and empty are one in the layout)."""
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        if field.is_repeated:
            for item in value:
                _canonical(item)
            continue
        _canonical(value)
        if value.ByteSize() == 0 and not (field.containing_oneof and field.containing_oneof.name == "data"):
            message.ClearField(field.name)
    return message
