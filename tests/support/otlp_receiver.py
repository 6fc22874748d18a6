"""An OTLP/HTTP backend for the forwarding tests (``comet ship`` to an
endpoint): a ``ScriptedServer`` whose answers a test decides (an outage, 429
with Retry-After, 400, a partial success...), and what it was sent, decoded.

``Backend`` keeps what a backend that honours ``Idempotency-Key`` stores:
the first body of each key that it answered 2xx; a body sent again under the
same key is a duplicate, which such a backend drops (our gateway does), and
which must carry the same records (``check_keys``).
"""

from __future__ import annotations

import base64
import gzip
import re
import ssl
import threading
from typing import Any, Callable

import orjson
from google.protobuf.json_format import ParseDict

from . import otlp
from .flaky_http import Seen, ScriptedServer, Step

KEY = re.compile(r"^(?P<stream>[^/]+)/(?P<shard>\d+)/(?P<first>\d+)-(?P<last>\d+)/(?P<incarnation>\d+)$")
ID_FIELDS = {"traceId", "spanId", "parentSpanId"}


def request_bytes(seen: Seen) -> bytes:
    """The protobuf export request of one POST, whatever its encoding."""
    body = seen.body
    if seen.headers.get("content-encoding") == "gzip":
        body = gzip.decompress(body)
    if seen.headers.get("content-type") == "application/json":
        signal = seen.path.rstrip("/").rsplit("/", 1)[-1]
        doc = _base64_ids(orjson.loads(body))
        return bytes(ParseDict(doc, otlp.REQUESTS[signal]()).SerializeToString())
    return body


def _base64_ids(value: Any) -> Any:
    """OTLP/JSON's hex ids as the protobuf JSON mapping's base64."""
    if isinstance(value, dict):
        return {k: (base64.b64encode(bytes.fromhex(v)).decode() if k in ID_FIELDS else _base64_ids(v))
                for k, v in value.items()}
    if isinstance(value, list):
        return [_base64_ids(v) for v in value]
    return value


def accepted(status: int = 200, body: bytes = b"") -> Step:
    return Step(status, {"Content-Type": "application/x-protobuf"}, body)


class Backend(ScriptedServer):
    """Answers each request with ``answer(seen)`` (default: 200) and keeps
    the first accepted body of every Idempotency-Key."""

    def __init__(self, answer: Callable[[Seen], Step] | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.answer = answer or (lambda seen: accepted())
        self.stored: dict[str, bytes] = {}
        self.duplicates: dict[str, list[bytes]] = {}
        self._store_lock = threading.Lock()
        super().__init__(self._decide, tls=tls)

    def _decide(self, seen: Seen) -> Step:
        step = self.answer(seen)
        if step.lost or (200 <= step.status < 300 and not step.reset and not step.hang):
            self.keep(seen)
        return step

    def keep(self, seen: Seen) -> None:
        key = seen.headers.get("idempotency-key", "")
        data = request_bytes(seen)
        with self._store_lock:
            if key in self.stored:
                self.duplicates.setdefault(key, []).append(data)
            else:
                self.stored[key] = data

    def check_keys(self) -> None:
        """Every key names its records: a body sent again under it is the same."""
        for key, again in self.duplicates.items():
            assert all(d == self.stored[key] for d in again), f"key {key} carried other records"
            assert KEY.match(key), key

    def records(self, signal: str) -> int:
        """Records stored (once per key); safe while requests still arrive."""
        with self._store_lock:
            bodies = list(self.stored.values())
        return sum(count_records(signal, body) for body in bodies)

    def in_key_order(self) -> list[bytes]:
        """The stored requests by shard and first entry (the order of the log)."""
        def order(key: str) -> tuple[int, int]:
            m = KEY.match(key)
            assert m, key
            return int(m["shard"]), int(m["first"])
        return [self.stored[k] for k in sorted(self.stored, key=order)]


def count_records(signal: str, body: bytes) -> int:
    request = otlp.decode(signal, body)
    groups, scopes, records = otlp.FIELDS[signal]
    total = 0
    for g in getattr(request, groups):
        for s in getattr(g, scopes):
            if signal != "metrics":
                total += len(getattr(s, records))
                continue
            for m in s.metrics:
                kind = m.WhichOneof("data")
                total += len(getattr(m, kind).data_points) if kind else 0
    return total
