"""POST /streams/{name}: one request is one atomic batch in one shard.

The checks run cheapest first and nothing is stored until all of them passed:
name, media type, encoding, declared size, in-flight budget, the body within
its limit, the decompressed body within its limit, then every event (JSON
parsed with orjson; the first bad one fails the request with its index).
Storage errors map to statuses: storage full -> 507 with Retry-After, an
entry above the limit -> 413, an unknown stream with auto-create off -> 404.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

import orjson
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Send

from storage_c import (
    BatchResult,
    CometError,
    EntryTooLarge,
    StorageFull,
    StreamNameError,
    StreamNotFound,
    check_stream_name,
)

from . import auth, logs
from .bodies import decompress, encoding_of
from .errors import HTTPError, error_body
from .runtime import Runtime

PREFIX = "/streams/"

JSON_TYPES = ("application/json",)
NDJSON_TYPES = ("application/x-ndjson", "application/jsonl", "application/json-lines",
                "application/x-jsonlines")
BYTES_TYPES = ("application/octet-stream",)


@dataclass
class Outcome:
    status: int = 500
    events: int = 0


def bad_event(index: int, exc: Exception) -> HTTPError:
    return HTTPError(400, "invalid_json", f"event {index} (line {index + 1}) is not valid JSON: {exc}",
                     extra={"index": index})


def json_events(body: bytes, validate: bool) -> list[bytes] | bytes:
    """One event per element of an array, else the value itself; events are
    stored as compact JSON (one line each)."""
    if not validate and body.lstrip()[:1] != b"[":
        return body
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        index = failing_element(exc.doc, exc.pos)
        if index is not None:
            raise HTTPError(400, "invalid_json", f"event {index} (element {index} of the array) "
                            f"is not valid JSON: {exc}", extra={"index": index}) from None
        raise HTTPError(400, "invalid_json", f"body is not valid JSON: {exc}") from None
    if isinstance(value, list):
        return [orjson.dumps(v) for v in value]
    return orjson.dumps(value)


JSON_STRUCTURE = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{},]')


def failing_element(doc: str, pos: int) -> int | None:
    """The index of the top-level array element holding character ``pos`` of
    ``doc`` (where the parser failed), or None when the body is not an array or
    the failure lies outside it.  Only runs on the error path."""
    start = len(doc) - len(doc.lstrip())
    if doc[start:start + 1] != "[":
        return None
    depth = index = 0
    for match in JSON_STRUCTURE.finditer(doc, start, pos):
        token = match.group()
        if token in "[{":
            depth += 1
        elif token in "]}":
            depth -= 1
            if depth == 0:
                return None            # the array closed before the error
        elif token == "," and depth == 1:
            index += 1
    return index


def ndjson_lines(body: bytes) -> list[bytes]:
    """Non-empty lines, each checked to hold exactly one JSON value."""
    if b"\r" in body:
        body = body.replace(b"\r\n", b"\n")
    # The common body first: no blank line, so every line is an event and one
    # parse of the lines joined as an array checks them all.  A blank line
    # makes that parse fail (",,"), as does a bad event or a line holding two
    # values ("1,2" changes the count): then filter and look line by line.
    lines = body.split(b"\n")
    if not lines[-1]:
        lines.pop()
    try:
        if len(orjson.loads(b"[" + b",".join(lines) + b"]")) == len(lines):
            return lines
    except orjson.JSONDecodeError:
        pass
    lines = [line for line in lines if line.strip()]
    for i, line in enumerate(lines):  # a line such as "1,2" fails here too
        try:
            orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise bad_event(i, exc) from None
    return lines


@dataclass
class Head:
    """What the ingest path needs from the request line and headers, read in
    one pass over the raw header list (Starlette's Headers would scan it once
    per lookup)."""

    stream: str
    content_type: str = ""
    encoding: str = "identity"
    length: int | None = None
    key: str | None = None
    authorization: str = ""

    @classmethod
    def parse(cls, scope: dict[str, Any]) -> Head:
        head = cls(scope["path"][len(PREFIX):])
        for name, value in scope["headers"]:
            if name == b"content-type":
                head.content_type = value.split(b";", 1)[0].strip().lower().decode("latin-1")
            elif name == b"content-length":
                head.length = int(value) if value.isdigit() else None
            elif name == b"content-encoding":
                head.encoding = value.decode("latin-1")
            elif name == b"x-comet-key":
                head.key = value.decode("utf-8", "replace")
            elif name == b"authorization":
                head.authorization = value.decode("latin-1")
        query = scope.get("query_string", b"")
        if b"key=" in query:
            for k, v in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
                if k == "key":
                    head.key = v
                    break
        return head


def check_media_type(value: str) -> str:
    if value in JSON_TYPES or value in NDJSON_TYPES or value in BYTES_TYPES:
        return value
    raise HTTPError(415, "unsupported_media_type",
                    f"Content-Type {value or '(none)'!r} is not accepted; use application/json, "
                    "application/x-ndjson (or application/jsonl) or application/octet-stream")


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole body, or 413 as soon as it passes ``limit`` bytes."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise HTTPError(413, "body_too_large",
                            f"request body is larger than max_body_bytes ({limit})")
        parts.append(chunk)
        if not message.get("more_body", False):
            return parts[0] if len(parts) == 1 else b"".join(parts)


class ClientGone(Exception):
    """The client disconnected before its body arrived: nothing to answer."""


class Ingest:
    """POST /streams/{name} as a plain ASGI application: the gateway's hot
    path, without Starlette's request and response objects."""

    def __init__(self, runtime: Runtime, access_log: bool) -> None:
        self.runtime = runtime
        self.access_log = access_log
        self.valid_names: set[str] = set()

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        t0 = time.perf_counter()
        head = Head.parse(scope)
        outcome = Outcome()
        try:
            auth.check_header(head.authorization, self.runtime.config)
            body, headers = await self.handle(head, receive, outcome)
            outcome.status = 202
        except HTTPError as exc:
            outcome.status, body, headers = exc.status, error_body(exc), exc.headers
        except ClientGone:
            return
        raw_headers = [(b"content-type", b"application/json"),
                       (b"content-length", str(len(body)).encode())]
        raw_headers += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        await send({"type": "http.response.start", "status": outcome.status, "headers": raw_headers})
        await send({"type": "http.response.body", "body": body})
        seconds = time.perf_counter() - t0
        metrics = self.runtime.metrics
        if metrics is not None:
            metrics.observe(outcome.status, seconds, outcome.events, head.length or 0)
        if self.access_log:
            logs.access({"event": "request", "method": "POST", "path": scope["path"],
                         "status": outcome.status, "events": outcome.events,
                         "ms": round(seconds * 1000, 3), "slot": self.runtime.slot})

    def check_name(self, stream: str) -> None:
        if stream in self.valid_names:
            return
        try:
            check_stream_name(stream)
        except StreamNameError as exc:
            raise HTTPError(400, "invalid_stream_name", str(exc)) from None
        if len(self.valid_names) < 10_000:
            self.valid_names.add(stream)

    async def handle(self, head: Head, receive: Receive, outcome: Outcome) -> tuple[bytes, dict[str, str]]:
        runtime = self.runtime
        config = runtime.config
        self.check_name(head.stream)
        if not runtime.ready:
            raise HTTPError(503, "draining" if runtime.draining else "starting",
                            "the worker is shutting down" if runtime.draining
                            else "the worker has not claimed its process slot yet",
                            retry_after=config.retry_after_s)
        kind = check_media_type(head.content_type)
        encoding = encoding_of(head.encoding)
        limit = config.max_body_bytes
        if head.length is not None and head.length > limit:
            raise HTTPError(413, "body_too_large",
                            f"Content-Length {head.length} is above max_body_bytes ({limit})")
        reserved = head.length if head.length is not None else limit
        if not runtime.reserve(reserved):
            raise HTTPError(429, "busy", "this worker's in-flight byte budget is spent; retry later",
                            retry_after=config.retry_after_s)
        try:
            body = await read_body(receive, limit)
            body = decompress(body, encoding, config.max_decompressed_bytes)
            if not body.strip():
                raise HTTPError(400, "empty_body", "the body holds no event")
            res = await store(runtime, head.stream, kind, body, head.key)
        finally:
            runtime.release(reserved)
        outcome.events = res.count
        return orjson.dumps({"stream": head.stream, "shard": res.shard, "first": res.first,
                             "last": res.last, "count": res.count}), {}


async def store(runtime: Runtime, stream: str, kind: str, body: bytes,
                key: str | None) -> BatchResult:
    log = runtime.log
    assert log is not None
    validate = runtime.config.validates(stream)
    always = runtime.config.storage.durability == "always"
    try:
        if kind in NDJSON_TYPES:
            if validate:
                call = (log.append_batch, stream, ndjson_lines(body))
            else:  # straight to C in one call: no per-line work here
                call = (log.append_delimited, stream, body.replace(b"\r\n", b"\n") if b"\r" in body else body)
        elif kind in JSON_TYPES:
            events = json_events(body, validate)
            if isinstance(events, list):
                if not events:
                    raise HTTPError(400, "empty_body", "the JSON array holds no event")
                call = (log.append_batch, stream, events)
            else:
                call = (log.append_batch, stream, [events])
        else:
            call = (log.append_batch, stream, [body])
        fn, name, payload = call
        if always:  # an fdatasync must not hold the event loop
            return await run_in_threadpool(fn, name, payload, key=key)  # type: ignore[operator,no-any-return]
        return fn(name, payload, key=key)  # type: ignore[operator,no-any-return]
    except StorageFull as exc:
        raise HTTPError(507, "storage_full", str(exc), retry_after=runtime.config.retry_after_s) from None
    except EntryTooLarge as exc:
        raise HTTPError(413, "event_too_large", str(exc)) from None
    except StreamNotFound as exc:
        raise HTTPError(404, "unknown_stream", f"{exc}; auto-create is off") from None
    except CometError as exc:
        raise HTTPError(500, "storage_error", str(exc)) from None
