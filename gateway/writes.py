"""The write side of a worker: opening and creating streams, and storing a
request's body in one atomic batch of one shard.

``Writer`` is what every ingest path stores through (gateway.ingest, gateway.otlp):
it answers 503 until the worker is ready (``check_ready``), takes a request's
part of the in-flight byte budget (``reserve``), opens a stream before this
worker's first write to it, or creates it as auto_create, max_streams and
the token's share of them allow, and stores (``store``, ``store_events``).

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
import re
from functools import partial

import xxhash
from starlette.concurrency import run_in_threadpool

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

from .answers import Head
from .bodies import UNDECLARED_STEP, Body, Reservation
from .errors import HTTPError, storage_error
from .runtime import Runtime
from .tokens import Token

JSON_TYPES = ("application/json",)
NDJSON_TYPES = ("application/x-ndjson", "application/jsonl", "application/json-lines",
                "application/x-jsonlines")
BYTES_TYPES = ("application/octet-stream",)
EVENTS = "events"
"""The kind of a body of events the gateway made itself (gateway.otlp): one
JSON event per line, stored without another check."""
ARRAY_START = re.compile(rb"[ \t\r\n]*\[")


def too_many_streams(stream: str, limit: int) -> str:
    """The detail of a 409 at max_streams: the limit, never how many streams exist."""
    return (f"cannot create stream {stream!r}: max_streams is {limit} (write to a stream that "
            "exists, or have one deleted or the limit raised)")


IDEMPOTENCY_KEY = re.compile(r"[\x20-\x7e]{1,255}")


def check_idempotency_key(value: str | None) -> None:
    """1 to 255 printable ASCII characters (400 otherwise)."""
    if value is not None and not IDEMPOTENCY_KEY.fullmatch(value):
        raise HTTPError(400, "bad_idempotency_key",
                        f"Idempotency-Key must be 1 to 255 printable ASCII characters; got "
                        f"{len(value)} characters" + ("" if value.isascii() and value.isprintable()
                                                      else ", some not printable ASCII"))


class StreamGone(Exception):
    """The stream this worker had open was deleted (by any process)."""



class Writer:
    """A worker's writes: the streams it has open, the opens under way, and
    the appends that wait on a thread (ShardHops)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.opened: set[str] = set()
        # streams being opened on a thread, by the first request that found them closed
        self.opening: dict[str, tuple[asyncio.Future[None], str | None]] = {}
        self.hops = ShardHops()

    def open_stream(self, stream: str, token: Token | None = None) -> None:
        """Opens the stream before its first write in this worker, or creates
        it as auto_create, max_streams and the token's share of them allow
        (gateway.tenants.Creators); creating touches the disk only once.  Then
        opens the shards this worker owns, here on the open's thread."""
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
        try:  # its unkeyed appends then start on the loop, not each shard's first on a thread
            log.open_shards(stream)
        except CometError:
            pass  # a shard that cannot open: the append that needs it answers its error
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

    async def store_events(self, head: Head, events: Body, key: str | bytes | None,
                           token: Token | None, offload: bool) -> BatchResult:
        """Events the gateway made (one JSON event per line) into ``head.stream``,
        with the request's Idempotency-Key."""
        work = partial(store, self.runtime, head.stream, EVENTS, events, key,
                       idempotency_key=head.idempotency_key, token=token)
        return await self.store(head.stream, work,
                                offload or self.runtime.config.storage.durability == "always", token)


class ShardHops:
    """Stores a body on the loop when that needs no waiting, else on a thread,
    one thread per shard at a time.  The appends that would wait come together:
    a burst of keyed requests finds a shard this worker has not opened, a
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
