"""POST /streams/{name}: one request is one atomic batch in one shard.

The checks run cheapest first and nothing is stored until all of them passed:
name, media type, encoding, declared size, in-flight budget, the body within
its limit, the decompressed body within its limit, then every event: JSON and
NDJSON bodies go to the C core in one call (``Log.ingest``), which validates
strict JSON, splits the events, checks each against max_entry_bytes as sent
and appends them atomically - or stores nothing and says which event, line
and byte was wrong.  Events are stored exactly as sent (only insignificant
whitespace is dropped), so a number or a string is never re-encoded.

No request holds the event loop for long: a compressed body, a large body, or
a durability=always append (an fdatasync) runs on a worker thread (the C call
releases the GIL), so health checks and small requests keep being answered.
Every other body is stored on the loop only if that needs no waiting
(``wait=False``); when the append would first wait - for a rotation, whose
file syncs took up to a second on a busy disk, for a due sync or for the
shard's lock - the core says so (WouldBlock) before storing anything, and the
call is made again on a thread.  One such call per shard at a time
(ShardHops): the requests that find the same shard waiting meanwhile wait for
it and then try the loop again, rather than queueing a thread each for the GIL.

Storage errors are answered as gateway.errors.STORAGE_ERRORS says (storage
full: 507 with Retry-After, an event above the limit: 413...).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass
from functools import partial
from urllib.parse import parse_qsl

import orjson
import xxhash
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from storage_c import (
    BatchResult,
    BodyFault,
    CometError,
    IdempotencyKey,
    InvalidJSON,
    NoEvents,
    ReadOnlyStorage,
    StorageFull,
    StorageGone,
    StreamLimit,
    StreamNotFound,
    SyncFailed,
    WouldBlock,
)
from comet.jsonlog import event

from . import auth, logs
from .bodies import decompress, encoding_of
from .errors import HTTPError, check_name, errors_answered, storage_error
from .metrics import series_of
from .runtime import Runtime
from .tokens import WRITE, Token

log = logging.getLogger("comet.gateway.ingest")

PREFIX = "/streams/"
SERIES = series_of("/streams/{name}", "POST")
"""Where the duration histogram of this route's requests starts."""

JSON_TYPES = ("application/json",)
NDJSON_TYPES = ("application/x-ndjson", "application/jsonl", "application/json-lines",
                "application/x-jsonlines")
BYTES_TYPES = ("application/octet-stream",)
EVENTS = "events"
"""The kind of a body of events the gateway made itself (gateway.otlp): one
JSON event per line, stored without another check."""

# Bodies above this many bytes (as received) are decoded, checked and stored
# on a worker thread: at the C core's ~1 GB/s this bounds what a request can
# take of the event loop to a fraction of a millisecond, while small bodies,
# nearly all of them, skip the thread hop (~50 us).
INLINE_BODY_BYTES = 256 << 10
UNDECLARED_STEP = 256 << 10
"""A body without a Content-Length holds what it has sent of the in-flight budget, taken
this much at a time: a slow upload holds little, not max_body_bytes."""
ARRAY_START = re.compile(rb"[ \t\r\n]*\[")


@dataclass
class Outcome:
    status: int = 500
    events: int = 0
    token: Token | None = None
    """The request's token (None: auth off, or no accepted token)."""


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
    authorizations: int = 0
    idempotency_key: str | None = None

    @classmethod
    def parse(cls, scope: Scope, stream: str | None = None) -> Head:
        """The head of a request to ``stream``, by default the one its path names."""
        head = cls(scope["path"][len(PREFIX):] if stream is None else stream)
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
                head.authorizations += 1
            elif name == b"idempotency-key":
                head.idempotency_key = value.decode("latin-1")
        query = scope.get("query_string", b"")
        if b"key=" in query:
            for k, v in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
                if k == "key":
                    head.key = v
                    break
        return head


def too_many_streams(stream: str, limit: int) -> str:
    """The detail of a 409 at max_streams: the limit, never how many streams exist."""
    return (f"cannot create stream {stream!r}: max_streams is {limit} (write to a stream that "
            "exists, or have one deleted or the limit raised)")


IDEMPOTENCY_KEY = re.compile(r"[\x20-\x7e]{1,255}")
REPLAYED = {"Idempotent-Replayed": "true"}


def check_idempotency_key(value: str | None) -> None:
    """1 to 255 printable ASCII characters (400 otherwise)."""
    if value is not None and not IDEMPOTENCY_KEY.fullmatch(value):
        raise HTTPError(400, "bad_idempotency_key",
                        f"Idempotency-Key must be 1 to 255 printable ASCII characters; got "
                        f"{len(value)} characters" + ("" if value.isascii() and value.isprintable()
                                                      else ", some not printable ASCII"))


def check_media_type(value: str) -> str:
    if value in JSON_TYPES or value in NDJSON_TYPES or value in BYTES_TYPES:
        return value
    raise HTTPError(415, "unsupported_media_type",
                    f"Content-Type {value or '(none)'!r} is not accepted; use application/json, "
                    "application/x-ndjson (or application/jsonl) or application/octet-stream")


Body = bytes | bytearray


class Reservation:
    """A request's part of the worker's in-flight byte budget: its declared
    length, or what an undeclared body has sent so far (UNDECLARED_STEP at a
    time).  The tenant is the request's token, or with auth off its stream: one
    tenant holds at most its share (inflight_share), so its slow or large
    uploads leave the rest of the budget to the others."""

    def __init__(self, runtime: Runtime, stream: str, token: Token | None) -> None:
        self.runtime = runtime
        self.tenant = f"token {token.name}" if token is not None else f"stream {stream}"
        self.who = f"token {token.name!r}" if token is not None else f"stream {stream!r}"
        self.held = 0

    def hold(self, nbytes: int) -> None:
        """Holds ``nbytes`` in all, or 429 when a budget is spent."""
        more = nbytes - self.held
        if more <= 0:
            return
        config = self.runtime.config
        spent = self.runtime.reserve(more, self.tenant, self.held)
        if spent == "tenant":
            raise HTTPError(429, "busy", f"the requests of {self.who} hold its share "
                            f"(inflight_share) of this worker's in-flight byte budget; retry later",
                            retry_after=config.retry_after_s)
        if spent is not None:
            raise HTTPError(429, "busy", "this worker's in-flight byte budget is spent; retry later",
                            retry_after=config.retry_after_s)
        self.held = nbytes

    def release(self) -> None:
        self.runtime.release(self.held, self.tenant)
        self.held = 0


async def read_body(receive: Receive, limit: int, length: int | None,
                    reservation: Reservation | None = None) -> Body:
    """The whole body, or 413 as soon as it passes ``limit`` bytes; a body
    passing what ``reservation`` holds (one without a Content-Length) holds
    more as it comes (429 when a budget is spent).

    A body above INLINE_BODY_BYTES whose length was declared is copied chunk
    by chunk into one buffer of that size, so that no single copy of a large
    body (a join holds the GIL) runs on the event loop; an undeclared one
    (chunked) is joined on a worker thread."""
    buffer = bytearray(length) if length is not None and length > INLINE_BODY_BYTES else None
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunk = message.get("body", b"")
        end = size + len(chunk)
        if end > limit:
            raise HTTPError(413, "body_too_large",
                            f"request body is larger than max_body_bytes ({limit})")
        if reservation is not None and end > reservation.held:
            reservation.hold(min(limit, max(end, reservation.held + UNDECLARED_STEP)))
        if buffer is None:
            parts.append(chunk)
        else:
            if end > len(buffer):  # the server enforces Content-Length; be safe anyway
                buffer.extend(bytes(end - len(buffer)))
            buffer[size:end] = chunk
        size = end
        if not message.get("more_body", False):
            break
    if buffer is not None:
        del buffer[size:]
        return buffer
    if len(parts) == 1:
        return parts[0]
    if size > INLINE_BODY_BYTES:
        return await run_in_threadpool(b"".join, parts)
    return b"".join(parts)


class StreamGone(Exception):
    """The stream this worker had open was deleted (by any process)."""


class ClientGone(Exception):
    """The client disconnected before its body arrived: nothing to answer."""


class Ingest:
    """POST /streams/{name} as a plain ASGI application: the gateway's hot
    path, without Starlette's request and response objects."""

    def __init__(self, runtime: Runtime, access_log: logs.AccessLog | None) -> None:
        self.runtime = runtime
        self.access_log = access_log
        self.opened: set[str] = set()
        # streams being opened on a thread, by the first request that found them closed
        self.opening: dict[str, tuple[asyncio.Future[None], str | None]] = {}
        self.hops = ShardHops()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        t0 = time.perf_counter()
        head = Head.parse(scope)
        outcome = Outcome()
        try:
            outcome.token = auth.identify(head.authorization, self.runtime.config,
                                          head.authorizations)
            auth.require(outcome.token, self.runtime.config, WRITE, head.stream)
            body, headers = await self.handle(head, receive, outcome)
            outcome.status = 202
        except HTTPError as exc:
            outcome.status, body, headers = exc.status, exc.body(), exc.headers
            self.runtime.answered(exc, scope)
        except ClientGone:
            return
        except Exception:  # a bug, not the client's fault: say so, answer (and count) a 500
            event(log, "internal_error", logging.ERROR, exc_info=True, method="POST",
                  path=scope["path"])
            error = HTTPError(500, "internal", "unexpected error; see the gateway's log")
            outcome.status, body, headers = 500, error.body(), error.headers
        raw_headers = [(b"content-type", b"application/json"),
                       (b"content-length", str(len(body)).encode())]
        raw_headers += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        await send({"type": "http.response.start", "status": outcome.status, "headers": raw_headers})
        await send({"type": "http.response.body", "body": body})
        seconds = time.perf_counter() - t0
        metrics = self.runtime.metrics
        if metrics is not None:
            metrics.observe(SERIES, outcome.status, seconds, outcome.events, head.length or 0)
        if self.access_log is not None:
            self.access_log.request(scope["path"], outcome.status, outcome.events, seconds,
                                    self.runtime.slot, outcome.token, scope.get("client"))

    def open_stream(self, stream: str, token: Token | None = None) -> None:
        """Opens the stream before its first write in this worker, or creates
        it as auto_create, max_streams and the token's share of them allow
        (gateway.tenants.Creators); creating touches the disk only once."""
        runtime = self.runtime
        log = runtime.log
        assert log is not None
        config = runtime.config
        try:
            try:
                log.open_stream(stream, create=False)
            except StreamNotFound:
                if not config.may_create(stream):
                    raise
                self.create_stream(stream, token)
        except CometError as exc:
            detail = None
            if isinstance(exc, StreamNotFound):
                detail = f"stream {stream!r} does not exist; " + (
                    "auto_create is off" if config.auto_create is False else
                    "auto_create allows only names matching " + ", ".join(
                        config.auto_create if isinstance(config.auto_create, tuple) else ()))
            elif isinstance(exc, StreamLimit):  # its message counts the streams: not for clients
                detail = too_many_streams(stream, config.max_streams)
            raise storage_error(exc, config.retry_after_s, detail) from None
        self.opened.add(stream)  # as many as the storage's own handles: one per stream

    async def open_once(self, stream: str, token: Token | None) -> None:
        """open_stream on a thread, once for the requests that find ``stream`` closed
        together (the first requests of a new stream, a burst on every connection):
        the others wait for that one instead of taking a thread each.  An open that
        failed answers the waiting requests of the same token; those of other tokens
        try again (the refusal may be its token's: its share of the streams), one of
        them opening for the rest."""
        name = token.name if token is not None else None
        while stream not in self.opened:
            entry = self.opening.get(stream)
            if entry is None or entry[0].done():
                pending: asyncio.Future[None] = asyncio.ensure_future(
                    run_in_threadpool(self.open_stream, stream, token))
                self.opening[stream] = (pending, name)
                pending.add_done_callback(partial(self._opened, stream))
                await asyncio.shield(pending)
                return
            pending, opener = entry
            try:
                await asyncio.shield(pending)
            except Exception:
                if opener == name:
                    raise

    def _opened(self, stream: str, done: asyncio.Future[None]) -> None:
        if self.opening.get(stream, (None, None))[0] is done:
            del self.opening[stream]
        if not done.cancelled():
            done.exception()  # seen here, should the first request be gone (cancelled)

    def create_stream(self, stream: str, token: Token | None) -> None:
        """Creates ``stream`` for ``token`` within max_streams (the streams the
        operator named aside) and the token's share (409 otherwise)."""
        runtime = self.runtime
        log = runtime.log
        assert log is not None
        config = runtime.config
        reserved = config.reserved_streams()
        with runtime.creators.locked():
            existing = set(log.streams())
            if stream not in existing and stream not in reserved:
                if config.max_streams and len(existing - reserved) >= config.max_streams:
                    raise HTTPError(409, "too_many_streams",
                                    too_many_streams(stream, config.max_streams))
                quota = config.streams_per_token
                if (quota and token is not None and not token.admin
                        and runtime.creators.count(token.name, existing) >= quota):
                    raise HTTPError(409, "too_many_streams", f"cannot create stream {stream!r}: "
                                    f"token {token.name!r} created as many streams as "
                                    f"max_streams_per_token allows ({quota}); write to one of them, "
                                    "or have one deleted")
            log.open_stream(stream, create=True)
            if stream not in existing:
                runtime.creators.record(token.name if token is not None else None, stream)

    async def handle(self, head: Head, receive: Receive, outcome: Outcome) -> tuple[bytes, dict[str, str]]:
        runtime = self.runtime
        config = runtime.config
        check_name(head.stream)
        check_idempotency_key(head.idempotency_key)
        self.check_ready()
        kind = check_media_type(head.content_type)
        encoding = encoding_of(head.encoding)
        reservation = self.reserve(head, outcome.token)
        try:
            body = await read_body(receive, config.max_body_bytes, head.length, reservation)
            work = partial(decode_and_store, runtime, head, kind, encoding, body, outcome.token)
            offload = (encoding != "identity" or len(body) > INLINE_BODY_BYTES
                       or config.storage.durability == "always")
            res = await self.store(head.stream, work, offload, outcome.token)
        finally:
            reservation.release()
        outcome.events = 0 if res.replayed else res.count
        return orjson.dumps({"stream": head.stream, "shard": res.shard, "first": res.first,
                             "last": res.last, "count": res.count}), REPLAYED if res.replayed else {}

    def check_ready(self) -> None:
        """503 while the worker has no slot yet or is shutting down."""
        runtime = self.runtime
        if not runtime.ready:
            raise HTTPError(503, "draining" if runtime.draining else "starting",
                            "the worker is shutting down" if runtime.draining
                            else "the worker has not claimed its process slot yet",
                            retry_after=runtime.config.retry_after_s)

    def reserve(self, head: Head, token: Token | None) -> Reservation:
        """Takes the request's part of the in-flight byte budget (413 for a
        declared length above the limit, 429 when a budget is spent); the
        caller gives it back with ``release``."""
        limit = self.runtime.config.max_body_bytes
        if head.length is not None and head.length > limit:
            raise HTTPError(413, "body_too_large",
                            f"Content-Length {head.length} is above max_body_bytes ({limit})")
        reservation = Reservation(self.runtime, head.stream, token)
        reservation.hold(head.length if head.length is not None else min(limit, UNDECLARED_STEP))
        return reservation

    async def store(self, stream: str, work: partial[BatchResult], offload: bool,
                    token: Token | None = None) -> BatchResult:
        """work() into ``stream``, opening (or creating, for ``token``) the stream
        first and again if it was deleted since this worker opened it."""
        runtime = self.runtime
        if stream not in self.opened:  # reads, maybe creates it (syncs): never on the loop
            await self.open_once(stream, token)
        try:
            res = await self.hops.store(stream, work, offload)
        except StreamGone:  # deleted since this worker opened it: open (or create) it anew
            self.opened.discard(stream)
            await self.open_once(stream, token)
            try:
                res = await self.hops.store(stream, work, offload)
            except StreamGone:
                raise HTTPError(503, "stream_deleted", f"stream {stream!r} is being "
                                "deleted; retry", retry_after=runtime.config.retry_after_s) from None
        if runtime.storage_full is not None:
            runtime.storage_full = None
        return res


class ShardHops:
    """Stores a body on the loop when that needs no waiting, else on a thread,
    one thread per shard at a time.  The appends that would wait come together:
    a new stream's first requests find every shard of this worker unopened, a
    rotation or a due sync turns away every request of its shard.  Each taking
    a thread queued dozens of threads for the GIL behind the loop (13-28 ms a
    request, for 0.1-0.4 ms of work); here the first one goes to a thread and
    the others wait for it, then try the loop again."""

    def __init__(self) -> None:
        self.running: dict[tuple[str, int | None], asyncio.Future[BatchResult]] = {}

    async def store(self, stream: str, work: partial[BatchResult], offload: bool) -> BatchResult:
        if offload:
            return await run_in_threadpool(work)
        try:
            return work(wait=False)
        except WouldBlock as exc:  # nothing was stored: the same call, to the shard it
            work = partial(work, shard=exc.shard)  # chose, on the loop again or allowed to wait
            where = (stream, exc.shard)
        while (ahead := self.running.get(where)) is not None:
            await asyncio.wait((ahead,))
            try:
                return work(wait=False)
            except WouldBlock:
                pass
        hop = asyncio.ensure_future(run_in_threadpool(work))
        self.running[where] = hop
        hop.add_done_callback(partial(self._done, where))
        return await asyncio.shield(hop)  # a client gone: its append finishes all the same

    def _done(self, where: tuple[str, int | None], hop: asyncio.Future[BatchResult]) -> None:
        if self.running.get(where) is hop:
            del self.running[where]
        if not hop.cancelled():
            hop.exception()  # seen here, should its request be gone


def decode_and_store(runtime: Runtime, head: Head, kind: str, encoding: str,
                     body: Body, token: Token | None = None, wait: bool = True,
                     shard: int | None = None) -> BatchResult:
    """Decompresses, checks and stores one body (on the loop or a thread);
    ``wait=False``: WouldBlock, nothing stored, where the append would wait."""
    body = decompress(body, encoding, runtime.config.max_decompressed_bytes)
    return store(runtime, head.stream, kind, body, head.key, wait, shard, head.idempotency_key,
                 token)


def refused(exc: CometError, retry_after_s: int) -> HTTPError:
    """The answer to a storage error; for a bad body (``fault`` set), one
    naming the first bad event, its line and byte."""
    fault = exc.fault
    if fault is None:
        return storage_error(exc, retry_after_s)
    if isinstance(exc, NoEvents):
        return storage_error(exc, retry_after_s, fault.reason)
    extra: dict[str, object] = {"line": fault.line, "offset": fault.offset}
    if fault.index is not None:
        extra["index"] = fault.index
    where = where_in_body(fault)
    if isinstance(exc, InvalidJSON):
        detail = f"{where} is not valid JSON: {fault.reason} (at byte {fault.offset})"
    else:
        detail = f"{where}: {fault.reason}"
    return storage_error(exc, retry_after_s, detail, extra)


def where_in_body(fault: BodyFault) -> str:
    if fault.index is None:
        return f"the body (line {fault.line})"
    return f"event {fault.index} (line {fault.line})"


def one_event(body: Body) -> Body:
    """The body, unless it holds nothing but whitespace (400), for the paths
    that store it unchecked; the C check reports that itself (NoEvents)."""
    if not body or body.isspace():
        raise HTTPError(400, "empty_body", "the body holds no event")
    return body


def body_format(runtime: Runtime, stream: str, kind: str, body: Body) -> tuple[str, Body]:
    """How a body of ``kind`` is stored, and what is stored of it: checked and
    split in C ("json", "ndjson") as the stream's policy says, or unchecked
    ("lines": one event per line, CRLF as LF; "raw": the body one event),
    when it is not blank (400)."""
    if kind == EVENTS:
        return "lines", body
    if kind in BYTES_TYPES:
        return "raw", one_event(body)
    validate = runtime.config.validates(stream)
    if kind in NDJSON_TYPES:
        if validate:
            return "ndjson", body
        return "lines", one_event(body.replace(b"\r\n", b"\n") if b"\r" in body else body)
    if validate or ARRAY_START.match(body):  # an array is split (and checked) in C
        return "json", body
    return "raw", one_event(body)


def store(runtime: Runtime, stream: str, kind: str, body: Body, key: str | bytes | None,
          wait: bool = True, shard: int | None = None,
          idempotency_key: str | None = None, token: Token | None = None) -> BatchResult:
    """One body into the log; ``shard`` None: the key's (the partition key,
    else the idempotency key), or the next in turn.  With ``idempotency_key``
    the body is stored once per key of ``token`` within the stream's window
    (one C call, Log.ingest: the key and the batch under one lock; a replay
    returns the batch the key stored before, flagged ``replayed``), in the
    shard its first attempt went to, whatever partition key this one carries
    (gateway.tenants.IdempotencyShards)."""
    log = runtime.log
    assert log is not None
    try:
        fmt, body = body_format(runtime, stream, kind, body)
        if idempotency_key is not None:
            window = runtime.config.idempotency_window(stream)
            scoped = idempotency_key if token is None else f"{token.name}\n{idempotency_key}"
            idem = IdempotencyKey.of(scoped, window, fmt.encode(), body)
            if shard is None:
                home = log.shard_for_key(stream, key if key is not None else idem.key)
                shard = runtime.idempotency_shards.shard_of(
                    xxhash.xxh3_128_digest(stream.encode() + b"\0" + idem.key), home,
                    log.shard_count(stream), window)
            return log.ingest(stream, body, fmt, key=key, shard=shard, wait=wait,
                              idempotency=idem)
        if fmt == "lines":  # no per-line work at all
            return log.append_delimited(stream, body, key=key, shard=shard, wait=wait)
        if fmt == "raw":
            return log.append_batch(stream, [body], key=key, shard=shard, wait=wait)
        return log.ingest(stream, body, fmt, key=key, shard=shard, wait=wait)
    except WouldBlock:
        raise  # nothing was stored: ShardHops makes the call again
    except StreamNotFound:
        raise StreamGone() from None
    except CometError as exc:
        if isinstance(exc, StorageFull):
            runtime.storage_full = str(exc)
        elif isinstance(exc, (StorageGone, ReadOnlyStorage, SyncFailed)):
            runtime.storage_refused = str(exc)
        raise refused(exc, runtime.config.retry_after_s) from None
