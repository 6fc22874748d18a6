"""POST /streams/{name}: one request is one atomic batch in one shard.

The checks run cheapest first and nothing is stored until all of them passed:
name, media type, encoding, declared size, in-flight budget, the body within
its limit, the decompressed body within its limit, then every event: JSON and
NDJSON bodies go to the C core in one call (``Log.ingest``), which validates
strict JSON, splits the events, checks each against max_entry_bytes as sent
and appends them atomically - or stores nothing and says which event, line
and byte was wrong.  Events are stored exactly as sent (only insignificant
whitespace is dropped), so a number or a string is never re-encoded.

Where the body is stored, on the loop or on a thread: gateway.writes.
"""

from __future__ import annotations

import logging
from functools import partial

import orjson
from starlette.types import Receive, Scope

from storage_c import BatchResult

from .answers import Head, Outcome, PlainRoute
from .bodies import INLINE_BODY_BYTES, Body, decompress, encoding_of, read_body
from .errors import HTTPError, check_name
from .logs import AccessLog
from .runtime import Runtime
from .tokens import Token
from .writes import BYTES_TYPES, JSON_TYPES, NDJSON_TYPES, Writer, check_idempotency_key, store

log = logging.getLogger("comet.gateway.ingest")

PREFIX = "/streams/"
REPLAYED = {"Idempotent-Replayed": "true"}


def check_media_type(value: str) -> str:
    if value in JSON_TYPES or value in NDJSON_TYPES or value in BYTES_TYPES:
        return value
    raise HTTPError(415, "unsupported_media_type",
                    f"Content-Type {value or '(none)'!r} is not accepted; use application/json, "
                    "application/x-ndjson (or application/jsonl) or application/octet-stream")


class Ingest(PlainRoute):
    """POST /streams/{name}, the gateway's hot path."""

    OK = 202
    log = log

    def __init__(self, writer: Writer, series: int, access_log: AccessLog | None) -> None:
        super().__init__(writer.runtime, series, access_log)
        self.writer = writer

    def head_of(self, scope: Scope) -> Head:
        return Head.parse(scope, scope["path"][len(PREFIX):])

    async def handle(self, head: Head, receive: Receive,
                     outcome: Outcome) -> tuple[bytes, dict[str, str]]:
        runtime = self.runtime
        config = runtime.config
        writer = self.writer
        check_name(head.stream)
        check_idempotency_key(head.idempotency_key)
        writer.check_ready()
        kind = check_media_type(head.content_type)
        encoding = encoding_of(head.encoding)
        reservation = writer.reserve(head, outcome.token)
        try:
            body = await read_body(receive, config.max_body_bytes, head.length, reservation)
            work = partial(decode_and_store, runtime, head, kind, encoding, body, outcome.token)
            offload = (encoding != "identity" or len(body) > INLINE_BODY_BYTES
                       or config.storage.durability == "always")
            res = await writer.store(head.stream, work, offload, outcome.token)
        finally:
            reservation.release()
        outcome.events = 0 if res.replayed else res.count
        return orjson.dumps({"stream": head.stream, "shard": res.shard, "first": res.first,
                             "last": res.last, "count": res.count}), REPLAYED if res.replayed else {}


def decode_and_store(runtime: Runtime, head: Head, kind: str, encoding: str,
                     body: Body, token: Token | None = None, wait: bool = True,
                     shard: int | None = None) -> BatchResult:
    """Decompresses, checks and stores one body (on the loop or a thread);
    ``wait=False``: WouldBlock, nothing stored, where the append would wait."""
    body = decompress(body, encoding, runtime.config.max_decompressed_bytes)
    return store(runtime, head.stream, kind, body, head.key, wait, shard, head.idempotency_key,
                 token)
