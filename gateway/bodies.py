"""Request bodies: read within their size limit and the worker's in-flight
byte budget (``read_body``, ``Reservation``), and decompressed within a size
limit, so that a decompression bomb is refused with 413 instead of taking a
worker's memory."""

from __future__ import annotations

import zlib

import zstandard
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive

from .errors import HTTPError
from .runtime import Runtime
from .tokens import Token

ENCODINGS = ("identity", "gzip", "deflate", "zstd")
ZLIB_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}  # HTTP's deflate is zlib
CHUNK = 1 << 16

# Bodies above this many bytes (as received) are decoded, checked and stored
# on a worker thread: at the C core's ~1 GB/s this bounds what a request can
# take of the event loop to a fraction of a millisecond, while small bodies,
# nearly all of them, skip the thread hop (~50 us).
INLINE_BODY_BYTES = 256 << 10
UNDECLARED_STEP = 256 << 10
"""A body without a Content-Length holds what it has sent of the in-flight budget, taken
this much at a time: a slow upload holds little, not max_body_bytes."""


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


class ClientGone(Exception):
    """The client disconnected before its body arrived: nothing to answer."""


def encoding_of(header: str | None) -> str:
    value = (header or "identity").strip().lower()
    if value not in ENCODINGS:
        raise HTTPError(415, "unsupported_encoding",
                        f"Content-Encoding {value!r} is not supported; use gzip, deflate, zstd or identity")
    return value


def _too_big(limit: int) -> HTTPError:
    return HTTPError(413, "decompressed_too_large",
                     f"decompressed body is larger than max_decompressed_bytes ({limit})")


def decompress(body: bytes | bytearray, encoding: str, limit: int) -> bytes | bytearray:
    """The decoded body; 413 the moment it would pass ``limit`` bytes, 400 if
    it is not valid data of that encoding."""
    if encoding == "identity":
        return body
    if encoding in ZLIB_WBITS:
        return _zlib(body, encoding, limit)
    return _zstd(body, limit)


def _zlib(body: bytes | bytearray, encoding: str, limit: int) -> bytes:
    d = zlib.decompressobj(wbits=ZLIB_WBITS[encoding])
    try:
        out = d.decompress(body, limit + 1)
        if len(out) > limit or d.unconsumed_tail:
            raise _too_big(limit)
        out += d.flush()
    except zlib.error as exc:
        raise HTTPError(400, "bad_encoding", f"body is not valid {encoding}: {exc}") from None
    if len(out) > limit:
        raise _too_big(limit)
    if not d.eof:
        raise HTTPError(400, "bad_encoding", f"{encoding} body is truncated")
    if d.unused_data:
        raise HTTPError(400, "bad_encoding", f"bytes after the end of the {encoding} stream")
    return out


def _zstd(body: bytes | bytearray, limit: int) -> bytes:
    """One zstd frame.  When the frame does not record its size, a bounded
    stream read first proves the output fits (a small frame can claim
    gigabytes); the decoding proper then also proves the frame is complete."""
    try:
        size = zstandard.frame_content_size(body)
        if size > limit:
            raise _too_big(limit)
        if size < 0:
            seen = 0
            with zstandard.ZstdDecompressor().stream_reader(body) as reader:
                while chunk := reader.read(CHUNK):
                    seen += len(chunk)
                    if seen > limit:
                        raise _too_big(limit)
        d = zstandard.ZstdDecompressor().decompressobj()
        out = d.decompress(body)
    except zstandard.ZstdError as exc:
        raise HTTPError(400, "bad_encoding", f"body is not valid zstd: {exc}") from None
    if not d.eof:
        raise HTTPError(400, "bad_encoding", "zstd body is truncated")
    if d.unused_data:
        raise HTTPError(400, "bad_encoding", "bytes after the end of the zstd frame")
    return out
