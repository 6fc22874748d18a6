"""Decompressing request bodies within a size limit, so that a decompression
bomb is refused with 413 instead of taking a worker's memory."""

from __future__ import annotations

import zlib
import zstandard

from .errors import HTTPError

ENCODINGS = ("identity", "gzip", "deflate", "zstd")
ZLIB_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}  # HTTP's deflate is zlib
CHUNK = 1 << 16


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
