"""What the OTLP/HTTP tests share: export requests built by hand, the exact
bytes a real exporter sent (``Recording``), a stream read back, and the
comparison of stored events with the reference (tests/support/otlp.py).

Stored events are compared as *typed* JSON: a double that reads back as an
integer (``2`` for ``2.0``) or the other way round is a difference, which
plain ``==`` on parsed JSON would not see (``2 == 2.0`` in Python).
"""

from __future__ import annotations

import gzip
import threading
import zlib
from typing import Any, Callable, Iterable, Mapping, NamedTuple

import orjson
import requests
import zstandard
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from . import otlp
from .server import ServerProcess

PROTOBUF = {"content-type": "application/x-protobuf"}
JSON = {"content-type": "application/json"}
STREAMS = {"logs": "otel-logs", "traces": "otel-traces", "metrics": "otel-metrics"}


# ---- comparing events -------------------------------------------------------------------

def typed(value: Any) -> Any:
    """``value`` with every number tagged by its JSON type, for comparisons."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return ("int", value)
    if isinstance(value, float):
        return ("float", value)
    if isinstance(value, dict):
        return {k: typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [typed(v) for v in value]
    raise TypeError(f"not a JSON value: {value!r}")


def expected(signal: str, bodies: Iterable[bytes]) -> list[Any]:
    """The reference events of these protobuf requests, in order, typed."""
    out: list[Any] = []
    for body in bodies:
        events, _ = otlp.events(signal, body)
        out.extend(typed(e) for e in events)
    return out


# ---- building requests ------------------------------------------------------------------

def any_value(value: Any) -> AnyValue:
    """An AnyValue of a Python value (bytes: bytes_value, dict: kvlist_value)."""
    out = AnyValue()
    if isinstance(value, bool):
        out.bool_value = value
    elif isinstance(value, int):
        out.int_value = value
    elif isinstance(value, float):
        out.double_value = value
    elif isinstance(value, str):
        out.string_value = value
    elif isinstance(value, bytes):
        out.bytes_value = value
    elif isinstance(value, list):
        out.array_value.SetInParent()  # an empty list too
        out.array_value.values.extend(any_value(v) for v in value)
    elif isinstance(value, dict):
        out.kvlist_value.SetInParent()
        out.kvlist_value.values.extend(key_values(value))
    elif value is not None:
        raise TypeError(value)
    return out


def key_values(attributes: Mapping[str, Any]) -> list[KeyValue]:
    return [KeyValue(key=k, value=any_value(v)) for k, v in attributes.items()]


def logs_request(service: str | None, records: Iterable[Mapping[str, Any]]) -> ExportLogsServiceRequest:
    """One resource (``service.name`` = service) and one scope holding log
    records; each record's ``body`` and ``attributes`` are Python values, the
    other keys fields of LogRecord."""
    request = ExportLogsServiceRequest()
    resource_logs = request.resource_logs.add()
    if service is not None:
        resource_logs.resource.attributes.extend(key_values({"service.name": service}))
    scope_logs = resource_logs.scope_logs.add()
    scope_logs.scope.name = "tests"
    for fields in records:
        record = scope_logs.log_records.add()
        for name, value in fields.items():
            if name == "body":
                record.body.CopyFrom(any_value(value))
            elif name == "attributes":
                record.attributes.extend(key_values(value))
            else:
                setattr(record, name, value)
    return request


def log_body(service: str | None, n: int, **fields: Any) -> bytes:
    """A logs request of ``n`` records whose bodies are "<service> <i>"."""
    return bytes(logs_request(service, [{"body": f"{service} {i}", "time_unix_nano": 1000 + i,
                                         **fields} for i in range(n)]).SerializeToString())


# ---- a real exporter's requests ---------------------------------------------------------

class Attempt(NamedTuple):
    url: str
    headers: dict[str, str]
    body: bytes
    """As sent (compressed if the exporter compresses)."""
    status: int
    response_headers: dict[str, str]
    response: bytes

    @property
    def payload(self) -> bytes:
        """The protobuf (or JSON) request, decompressed."""
        encoding = {k.lower(): v for k, v in self.headers.items()}.get("content-encoding", "")
        if encoding == "gzip":
            return gzip.decompress(self.body)
        if encoding == "deflate":
            return zlib.decompress(self.body)
        if encoding == "zstd":
            return zstandard.ZstdDecompressor().decompress(self.body)
        return self.body


class Recording(requests.Session):
    """A session for the SDK's OTLP/HTTP exporters (``session=``) that keeps
    every attempt they make, answer included, and lets a test wait for one."""

    def __init__(self) -> None:
        super().__init__()
        self.attempts: list[Attempt] = []
        self._changed = threading.Condition()

    def request(self, method: Any, url: Any, *args: Any, **kwargs: Any) -> requests.Response:
        response = super().request(method, url, *args, **kwargs)
        data = kwargs.get("data") or b""
        attempt = Attempt(str(url), dict(kwargs.get("headers") or {}), bytes(data),
                          response.status_code, dict(response.headers), response.content)
        with self._changed:
            self.attempts.append(attempt)
            self._changed.notify_all()
        return response

    def wait_for(self, found: Callable[[Attempt], bool], timeout: float = 30) -> Attempt:
        """The first attempt for which ``found`` is true, once it has been made."""
        with self._changed:
            hit: list[Attempt] = []

            def seen() -> bool:
                hit[:] = [a for a in self.attempts if found(a)][:1]
                return bool(hit)

            assert self._changed.wait_for(seen, timeout), \
                f"no such attempt within {timeout} s; attempts: {[a.status for a in self.attempts]}"
            return hit[0]

    def stored(self) -> list[bytes]:
        """The payloads of the attempts answered 2xx, in order."""
        return [a.payload for a in self.attempts if 200 <= a.status < 300]


# ---- reading a stream back --------------------------------------------------------------

class Entry(NamedTuple):
    shard: int
    entry: int
    value: Any


def read_stream(server: ServerProcess, stream: str) -> list[Entry]:
    """Every entry of ``stream``, shard by shard in entry order, over HTTP
    (GET /streams/{name}/entries); [] when there is no such stream."""
    status, body, _ = server.request("GET", f"/streams/{stream}")
    if status == 404:
        return []
    assert status == 200, body
    out: list[Entry] = []
    for shard in range(len(orjson.loads(body)["shards"])):
        start = 0
        while True:
            status, body, _ = server.request(
                "GET", f"/streams/{stream}/entries?shard={shard}&from={start}&limit=1000")
            assert status == 200, body
            page = orjson.loads(body)
            assert page["skipped"] == 0, page
            out.extend(Entry(shard, e["entry"], e["value"]) for e in page["entries"])
            if not page["entries"]:
                break
            start = page["next"]
    return out


def new_entries(before: list[Entry], after: list[Entry]) -> list[Entry]:
    seen = {(e.shard, e.entry) for e in before}
    assert seen <= {(e.shard, e.entry) for e in after}, "entries were lost"
    return [e for e in after if (e.shard, e.entry) not in seen]
