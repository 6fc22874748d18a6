"""POST /streams/{name}: one request is one atomic batch in one shard.

The checks run cheapest first and nothing is stored until all of them passed:
name, media type, encoding, declared size, in-flight budget, the body within
its limit, the decompressed body within its limit, then every event (JSON
parsed with orjson; the first bad one fails the request with its index).
Storage errors map to statuses: storage full -> 507 with Retry-After, an
entry above the limit -> 413, an unknown stream with auto-create off -> 404.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import orjson
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from storage_c import (
    BatchResult,
    CometError,
    EntryTooLarge,
    StorageFull,
    StreamNameError,
    StreamNotFound,
    check_stream_name,
)

from .bodies import decompress, encoding_of, read_limited
from .errors import HTTPError
from .runtime import Runtime

JSON_TYPES = ("application/json",)
NDJSON_TYPES = ("application/x-ndjson", "application/jsonl", "application/json-lines",
                "application/x-jsonlines")
BYTES_TYPES = ("application/octet-stream",)


@dataclass
class Outcome:
    status: int = 500
    events: int = 0


def media_type(request: Request) -> str:
    value = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if value in JSON_TYPES or value in NDJSON_TYPES or value in BYTES_TYPES:
        return value
    raise HTTPError(415, "unsupported_media_type",
                    f"Content-Type {value or '(none)'!r} is not accepted; use application/json, "
                    "application/x-ndjson (or application/jsonl) or application/octet-stream")


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
        raise HTTPError(400, "invalid_json", f"body is not valid JSON: {exc}") from None
    if isinstance(value, list):
        return [orjson.dumps(v) for v in value]
    return orjson.dumps(value)


def ndjson_lines(body: bytes) -> list[bytes]:
    """Non-empty lines, each checked to hold exactly one JSON value."""
    if b"\r" in body:
        body = body.replace(b"\r\n", b"\n")
    lines = [line for line in body.split(b"\n") if line.strip()]
    # One parse for the whole body: the lines joined as an array.  If that
    # fails or finds another count of values, look line by line for the culprit.
    try:
        if len(orjson.loads(b"[" + b",".join(lines) + b"]")) == len(lines):
            return lines
    except orjson.JSONDecodeError:
        pass
    for i, line in enumerate(lines):  # a line such as "1,2" fails here too
        try:
            orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise bad_event(i, exc) from None
    return lines


def key_of(request: Request) -> str | None:
    key = request.query_params.get("key")
    return key if key is not None else request.headers.get("x-comet-key")


def accepted(stream: str, res: BatchResult) -> Response:
    body = orjson.dumps({"stream": stream, "shard": res.shard, "first": res.first,
                         "last": res.last, "count": res.count})
    return Response(body, status_code=202, media_type="application/json")


async def ingest(request: Request, runtime: Runtime, outcome: Outcome) -> Response:
    config = runtime.config
    stream = request.path_params["name"]
    try:
        check_stream_name(stream)
    except StreamNameError as exc:
        raise HTTPError(400, "invalid_stream_name", str(exc)) from None
    if not runtime.ready:
        raise HTTPError(503, "draining" if runtime.draining else "starting",
                        "the worker is shutting down" if runtime.draining
                        else "the worker has not claimed its process slot yet",
                        retry_after=config.retry_after_s)
    kind = media_type(request)
    encoding = encoding_of(request.headers.get("content-encoding"))
    declared = request.headers.get("content-length")
    limit = config.max_body_bytes
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPError(413, "body_too_large",
                        f"Content-Length {declared} is above max_body_bytes ({limit})")
    reserved = int(declared) if declared and declared.isdigit() else limit
    if not runtime.reserve(reserved):
        raise HTTPError(429, "busy", "this worker's in-flight byte budget is spent; retry later",
                        retry_after=config.retry_after_s)
    try:
        body = await read_limited(request.stream(), limit)
        body = decompress(body, encoding, config.max_decompressed_bytes)
        if not body.strip():
            raise HTTPError(400, "empty_body", "the body holds no event")
        return await store(request, runtime, stream, kind, body, outcome)
    finally:
        runtime.release(reserved)


async def store(request: Request, runtime: Runtime, stream: str, kind: str, body: bytes,
                outcome: Outcome) -> Response:
    log = runtime.log
    assert log is not None
    validate = runtime.config.validates(stream)
    key = key_of(request)
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
            res = await run_in_threadpool(fn, name, payload, key=key)  # type: ignore[operator]
        else:
            res = fn(name, payload, key=key)  # type: ignore[operator]
    except StorageFull as exc:
        raise HTTPError(507, "storage_full", str(exc), retry_after=runtime.config.retry_after_s) from None
    except EntryTooLarge as exc:
        raise HTTPError(413, "event_too_large", str(exc)) from None
    except StreamNotFound as exc:
        raise HTTPError(404, "unknown_stream", f"{exc}; auto-create is off") from None
    except CometError as exc:
        raise HTTPError(500, "storage_error", str(exc)) from None
    outcome.events = res.count
    return accepted(stream, res)


def now() -> float:
    return time.perf_counter()
