"""The Python API of the storage core: a thin, typed layer over the C library.

Every append crosses into C once, whatever the batch size.  ``append``,
``append_batch`` and ``ingest`` are themselves C methods (``_fastpath.c``: a
list of payloads is handed over item by item without a copy, and the GIL is
let go only when the append has to wait); an NDJSON body goes as one buffer
plus its delimiter.  Compression happens here, with ``zstandard`` (which releases the
GIL), before C takes any lock; C decompresses on the read path.
"""

from __future__ import annotations

import itertools
import os
import struct
import threading
import weakref
from array import array
from typing import Any, Iterable, Iterator, NoReturn, Sequence

import zstandard

from ._comet import ffi, lib
from ._native import Appender, StreamBase
from .config import DURABILITY_CODES, Config
from .errors import (Closed, ShardRangeError, WouldBlock, body_error, error_for, ingest_error,
                     raise_for)
from .groups import Group
from .records import (
    BatchResult,
    Buffer,
    GroupBacklog,
    GroupInfo,
    IdempotencyKey,
    NdjsonBatch,
    Problem,
    ReadBatch,
    ReplayedBatch,
    RetentionReport,
    ShardStats,
    StreamStats,
    VerifyReport,
    as_bytes,
)
from .split import BODY_FORMATS, body_format

_WANTS_COMPRESSION = lib.COMET_E_WANTS_COMPRESSION
_WOULD_BLOCK = lib.COMET_E_WOULD_BLOCK
_BUFFER_TOO_SMALL = lib.COMET_E_BUFFER_TOO_SMALL
_NO_STREAM = lib.COMET_E_NO_STREAM
_COMPRESSED = lib.COMET_ENTRY_COMPRESSED
_STAT_FIELDS = tuple(f for f in ShardStats.__dataclass_fields__ if f != "shard")


def _stats_layout() -> struct.Struct:
    """comet_shard_stats read in one unpack: a getattr per field of the cdata
    took half the time of listing 16,000 shards.  Its fields must be
    ShardStats's, in the same order (checked here, when the module loads)."""
    fields = sorted(ffi.typeof("comet_shard_stats").fields, key=lambda f: f[1].offset)
    names = tuple(name for name, _ in fields)
    if names != _STAT_FIELDS:
        raise ImportError(f"comet_shard_stats {names} is not ShardStats {_STAT_FIELDS}")
    codes = {"uint64_t": "Q", "int64_t": "q"}
    layout = struct.Struct("=" + "".join(codes[f.type.cname] for _, f in fields))
    if layout.size != ffi.sizeof("comet_shard_stats"):
        raise ImportError("comet_shard_stats has padding or fields of other types")
    return layout


_STATS_LAYOUT = _stats_layout()


def _mode(wait: bool) -> int:
    return lib.COMET_APPEND_WAIT if wait else lib.COMET_APPEND_NOWAIT


DEFAULT_READ_BYTES = 4 << 20
MAX_SCRATCH_BYTES = 64 << 20  # larger entries grow the buffer on demand


class _Stream(StreamBase):
    """A stream opened in this process: its C handle and the rotation over
    this process's own shards for unkeyed writes (the fields Log.append
    reads in C are StreamBase's: the handle, shards, rotation)."""

    __slots__ = ("name", "ptr")

    def __init__(self, name: str, ptr: Any, shards: int, owned: Sequence[int]) -> None:
        super().__init__(int(ffi.cast("uintptr_t", ptr)), shards)
        self.name = name
        self.ptr = ptr
        self.rotation = itertools.cycle(owned or range(shards))

    def pick(self, key: str | bytes | None) -> int:
        if key is None:
            return next(self.rotation)
        if isinstance(key, str):
            key = key.encode()
        return lib.comet_shard_for_key(self.ptr, key, len(key))

    def out_of_range(self, shard: int) -> ShardRangeError:
        return ShardRangeError(f"shard {shard} is out of range: stream {self.name!r} has "
                               f"{self.shards} shards")

    def reset_rotation(self, owned: Sequence[int]) -> None:
        self.rotation = itertools.cycle(owned or range(self.shards))


class _Scratch(threading.local):
    """Per-thread read buffers, reused across reads and grown on demand."""

    def __init__(self) -> None:
        self.capacity = 0
        self.max_entries = 0
        self.req = ffi.new("comet_read_request *")
        self.res = ffi.new("comet_read_result *")
        self.data = bytearray()
        self.offsets = array("i")
        self.entries = array("q")
        self.timestamps = array("q")

    def ensure(self, data_bytes: int, max_entries: int) -> None:
        req = self.req
        if data_bytes > self.capacity:
            self.data = bytearray(data_bytes)
            self.capacity = data_bytes
            self._data_ptr = ffi.from_buffer(self.data)
            req.data = ffi.cast("uint8_t *", self._data_ptr)
            req.data_capacity = data_bytes
        if max_entries > self.max_entries:
            self.offsets = array("i", bytes(4 * (max_entries + 1)))
            self.entries = array("q", bytes(8 * max_entries))
            self.timestamps = array("q", bytes(8 * max_entries))
            self._keep = (ffi.from_buffer(self.offsets), ffi.from_buffer(self.entries),
                          ffi.from_buffer(self.timestamps))
            req.offsets = ffi.cast("int32_t *", self._keep[0])
            req.entries = ffi.cast("int64_t *", self._keep[1])
            req.timestamps = ffi.cast("int64_t *", self._keep[2])
            self.max_entries = max_entries


class _IngestCall(threading.local):
    """Per-thread request and result structs of comet_ingest, with the fields
    that are the same for every call of a Log already set."""

    def __init__(self, compress_above: int, level: int) -> None:
        self.req = ffi.new("comet_ingest_request *")
        self.req.compress_above = compress_above
        self.req.compress_level = level
        self.res = ffi.new("comet_ingest_result *")
        self.idempotency = ffi.new("comet_idempotency *")


class _Codec(threading.local):
    """Per-thread zstd compressor (instances must not be shared by threads)."""

    def __init__(self, level: int) -> None:
        self.compressor = zstandard.ZstdCompressor(level=level, write_content_size=True)


def check_stream_name(name: str) -> None:
    """Raises StreamNameError unless ``name`` is a valid stream name."""
    raw = name.encode("utf-8", "surrogateescape")
    rc = lib.comet_validate_stream_name(raw, len(raw))
    if rc < 0:
        raise_for(rc)


class Log(Appender):
    """A data directory: streams of shards of entries.

    >>> with Log("/var/lib/comet") as log:
    ...     shard, entry = log.append("events", b'{"a": 1}')
    ...     batch = log.read("events", shard, entry)

    Safe to share between threads.  Open it after fork(), never before.
    """

    def __init__(self, path: str | os.PathLike[str], config: Config | None = None, *,
                 claim_slot: bool | int = False) -> None:
        self.path = os.path.abspath(os.fspath(path))  # a later chdir must not move it
        self.config = config or Config()
        out = ffi.new("comet_db **")
        rc = lib.comet_open(os.fsencode(self.path), self.config.to_c(), out)
        if rc < 0:
            raise_for(rc)
        self._db = out[0]
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()
        self._threshold = self.config.compression_threshold or (1 << 62)
        self._raw_limit = self.config.compression_threshold - 1 if self.config.compression_threshold else 0
        self._fast_init(self._streams, _Stream, BatchResult, self._threshold, self._raw_limit,
                        self.config.compression_level)
        self._codec = _Codec(self.config.compression_level)
        self._ingest = _IngestCall(self._raw_limit, self.config.compression_level)
        self._scratch = _Scratch()
        self._finalizer = weakref.finalize(self, lib.comet_close, self._db)
        if claim_slot is not False:
            self.claim_slot(None if claim_slot is True else int(claim_slot))

    # ---- lifecycle -------------------------------------------------------------

    def close(self) -> None:
        """Flushes what this process wrote and releases everything (idempotent)."""
        with self._lock:
            self._streams.clear()
            self._finalizer()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def __enter__(self) -> Log:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if not self._finalizer.alive:
            raise Closed(f"data directory {self.path} is closed")

    # ---- slots and streams -------------------------------------------------------

    def claim_slot(self, slot: int | None = None) -> int:
        """Claims the lowest free process slot (or the given one) until close or death."""
        self._check_open()
        rc = lib.comet_claim_slot(self._db, -1 if slot is None else slot)
        if rc < 0:
            raise_for(rc)
        for stream in self._streams.values():
            stream.reset_rotation(self.owned_shards(stream.name))
        return rc

    @property
    def slot(self) -> int | None:
        if self.closed:
            return None
        slot = lib.comet_slot(self._db)
        return None if slot < 0 else slot

    @property
    def process_count(self) -> int:
        return self.config.process_count

    def _open_stream(self, name: str, shards: int = 0, create: bool | None = None) -> _Stream:
        self._check_open()
        if not isinstance(name, str):
            raise TypeError(f"stream names are str, not {type(name).__name__}")
        if create is None:
            create = self.config.auto_create_streams
        raw = name.encode("utf-8", "surrogateescape")
        out = ffi.new("comet_stream **")
        rc = lib.comet_stream_open(self._db, raw, len(raw), shards or 0, 1 if create else 0, out)
        if rc < 0:
            raise_for(rc)
        with self._lock:
            stream = self._streams.get(name)
            if stream is None:
                count = lib.comet_stream_shards(out[0])
                stream = _Stream(name, out[0], count, self._owned(out[0], count))
                self._streams[name] = stream
        return stream

    def open_stream(self, name: str, *, create: bool | None = None) -> int:
        """Opens a stream for this process (creating it when ``create``, by
        default the config's auto_create_streams); returns its shard count.
        StreamNotFound when it does not exist and may not be created,
        StreamLimit when creating it would pass max_streams."""
        s = self._streams.get(name) or self._open_stream(name, create=create)
        return s.shards

    def delete_stream(self, name: str) -> None:
        """Deletes a stream and frees its disk (see comet_stream_delete): every
        process using it gets StreamNotFound at its next append or read, and
        a later write may create the name again, empty."""
        self._check_open()
        raw = name.encode("utf-8", "surrogateescape")
        rc = lib.comet_stream_delete(self._db, raw, len(raw))
        with self._lock:
            self._streams.pop(name, None)
        if rc < 0:
            raise_for(rc)

    def _forget_if_deleted(self, name: str, rc: int) -> None:
        """A stream deleted by any process: drop this process's handle, so
        that the next call opens (or creates) the stream anew."""
        if rc == _NO_STREAM:
            with self._lock:
                self._streams.pop(name, None)

    def _raise(self, name: str, rc: int, shard: int | None = None) -> NoReturn:
        self._forget_if_deleted(name, rc)
        exc = error_for(rc)
        if isinstance(exc, WouldBlock):
            exc.shard = shard
        raise exc

    def stream_created_ns(self, name: str) -> int:
        """When the stream was created (unix ns): a stream deleted and created
        again under the same name has another value."""
        s = self._streams.get(name) or self._open_stream(name, create=False)
        return int(lib.comet_stream_created(s.ptr))

    def create_stream(self, name: str, shards: int | None = None) -> int:
        """Creates a stream (or checks an existing one's shard count); returns its shard count."""
        return self._open_stream(name, shards or self.config.shards, create=True).shards

    def shard_count(self, stream: str) -> int:
        """Shard count of an existing stream (StreamNotFound otherwise)."""
        s = self._streams.get(stream) or self._open_stream(stream, create=False)
        return s.shards

    def streams(self) -> list[str]:
        """Names of the streams in the data directory, sorted."""
        self._check_open()
        need = lib.comet_list_streams(self._db, ffi.NULL, 0)
        if need < 0:
            raise_for(need)
        buf = ffi.new("char[]", need + 1)
        got = lib.comet_list_streams(self._db, buf, need + 1)
        if got < 0:
            raise_for(got)
        text = ffi.unpack(buf, min(got, need)).decode()
        return sorted(n for n in text.split("\n") if n)

    def _owned(self, ptr: object, count: int) -> list[int]:
        slot = lib.comet_slot(self._db)
        if slot < 0:
            return list(range(count))
        return [s for s in range(count) if lib.comet_shard_owner(ptr, s) == slot]

    def owned_shards(self, stream: str) -> list[int]:
        """Shards this process owns (all of them when it holds no slot)."""
        s = self._streams.get(stream) or self._open_stream(stream)
        return self._owned(s.ptr, s.shards)

    def open_shards(self, stream: str) -> list[int]:
        """Opens the shards this process owns (reading their files, repairing a
        torn tail a dead writer left): the part of their first append that may
        wait, done ahead, so that appends with ``wait=False`` find them open.
        Returns them."""
        s = self._streams.get(stream) or self._open_stream(stream, create=False)
        rc = lib.comet_shard_open(s.ptr, -1)  # one call: one wait for the GIL after it, not one a shard
        if rc < 0:
            self._raise(stream, rc)
        return self._owned(s.ptr, s.shards)

    def shard_for_key(self, stream: str, key: str | bytes) -> int:
        s = self._streams.get(stream) or self._open_stream(stream)
        return s.pick(key)

    # ---- appends -----------------------------------------------------------------

    # append and append_batch are C methods (storage_c/_fastpath.c): they take
    # the fast way for a known stream, bytes below the compression threshold,
    # default durability and no key, and call these two for everything else.

    def _append_general(self, stream: str, payload: Buffer, *, shard: int | None = None,
                        key: str | bytes | None = None, durability: str | None = None,
                        wait: bool = True) -> tuple[int, int]:
        """Log.append when the fast way does not apply (see Appender.append)."""
        s = self._streams.get(stream) or self._open_stream(stream)
        if shard is None:
            shard = s.pick(key)
        rc = self._append_slow(s, shard, payload, durability, wait)
        if rc < 0:
            self._raise(stream, rc, shard)
        return shard, rc

    # A wrong call reaches these through the C method: its TypeError names what
    # the caller called, not the Python function behind it.
    _append_general.__qualname__ = "Log.append"

    def _append_slow(self, s: _Stream, shard: int, payload: object,
                     durability: str | None, wait: bool) -> int:
        payload = as_bytes(payload)
        flags = 0
        if self._threshold <= len(payload) <= self.config.max_entry_bytes:
            payload, flags = self._compress(payload)
        try:
            return lib.comet_append(s.ptr, shard, payload, len(payload), flags,
                                    DURABILITY_CODES[durability], _mode(wait))
        except OverflowError:
            raise s.out_of_range(shard) from None

    def _append_batch_general(self, stream: str, payloads: Iterable[Buffer], *,
                              shard: int | None = None, key: str | bytes | None = None,
                              durability: str | None = None, wait: bool = True) -> BatchResult:
        """Log.append_batch when the fast way does not apply (see Appender.append_batch)."""
        s = self._streams.get(stream) or self._open_stream(stream)
        if shard is None:
            shard = s.pick(key)
        if type(payloads) is not list and type(payloads) is not tuple:
            payloads = list(payloads)
        return self._append_compressed(s, shard, payloads, durability, wait)

    _append_batch_general.__qualname__ = "Log.append_batch"

    def append_delimited(self, stream: str, buffer: Buffer, delimiter: bytes = b"\n", *,
                         shard: int | None = None, key: str | bytes | None = None,
                         skip_empty: bool = True, durability: str | None = None,
                         wait: bool = True) -> BatchResult:
        """One entry per delimited record of ``buffer`` (NDJSON: one per line).
        ``wait=False``: WouldBlock, nothing stored, where the append would wait."""
        if len(delimiter) != 1:
            raise ValueError("the delimiter is a single byte")
        s = self._streams.get(stream) or self._open_stream(stream)
        if shard is None:
            shard = s.pick(key)
        if type(buffer) is not bytes:
            buffer = as_bytes(buffer)
        count = ffi.new("uint32_t *")
        try:
            rc = lib.comet_append_delimited(s.ptr, shard, buffer, len(buffer), delimiter[0],
                                            1 if skip_empty else 0, self._raw_limit,
                                            DURABILITY_CODES[durability], _mode(wait), count)
        except OverflowError:
            raise s.out_of_range(shard) from None
        if rc == _WANTS_COMPRESSION:
            parts = buffer.split(delimiter)
            if parts and parts[-1] == b"":
                parts.pop()  # a trailing delimiter ends the last record
            if skip_empty:
                parts = [p for p in parts if p]
            return self._append_compressed(s, shard, parts, durability, wait)
        if rc < 0:
            self._raise(stream, rc, shard)
        return BatchResult(shard, rc, count[0])

    # ingest is a C method too (storage_c/_fastpath.c), for a known stream,
    # no key and default durability; it reports a refused body through
    # _ingest_failed, and takes every other call to _ingest_general.

    def _ingest_general(self, stream: str, body: Buffer, format: str = "json", *,
                        shard: int | None = None, key: str | bytes | None = None,
                        durability: str | None = None, wait: bool = True,
                        idempotency: IdempotencyKey | None = None) -> BatchResult:
        """Log.ingest when the fast way does not apply (see Appender.ingest):
        validates a request body and appends its events as one atomic batch.

        ``format`` "json": an array gives one event per element, any other
        value one event; "ndjson": one event per line that is not blank.  The
        body must be strict JSON (RFC 8259, UTF-8); events are stored exactly
        as sent apart from insignificant whitespace; each is checked against
        max_entry_bytes at its size as sent.  On a bad body nothing is stored
        and InvalidJSON, EntryTooLarge or NoEvents is raised with ``fault``
        (event index, line, byte offset, reason).  One C call, which releases
        the GIL: run it off an event loop for large bodies.  ``wait=False``:
        WouldBlock, nothing stored, where the append would have to wait.
        "lines" and "raw" store unchecked (storage_c.split.BODY_FORMATS).

        ``idempotency``: the batch is stored once per key within its window
        (comet.h, comet_idempotency): a call whose key stored a batch before
        returns that batch as a ReplayedBatch and stores nothing, or raises
        IdempotencyKeyReused when its digest differs.  Every attempt must go
        to the same shard (``key`` or ``shard``; by default the shard of the
        idempotency key).
        """
        s = self._streams.get(stream) or self._open_stream(stream)
        if shard is None:
            shard = s.pick(key if key is not None or idempotency is None else idempotency.key)
        call = self._ingest
        req, res = call.req, call.res
        if idempotency is not None:
            idem = call.idempotency
            ffi.memmove(idem.key, idempotency.key, 16)
            ffi.memmove(idem.digest, idempotency.digest, 16)
            idem.window_ms = idempotency.window_ms
            req.idempotency = idem
        keep = ffi.from_buffer(body)
        req.body = keep
        req.len = len(keep)
        req.format = BODY_FORMATS.get(format) or body_format(format)
        req.durability = DURABILITY_CODES[durability]
        req.mode = _mode(wait)
        try:
            rc = lib.comet_ingest(s.ptr, shard, req, res)
        except OverflowError:
            raise s.out_of_range(shard) from None
        finally:
            req.body = ffi.NULL
            req.idempotency = ffi.NULL
        if rc == _WOULD_BLOCK:
            self._raise(stream, rc, shard)
        if rc < 0:
            self._forget_if_deleted(stream, rc)
            raise ingest_error(rc, res)
        if res.replayed:
            return ReplayedBatch(shard, rc, res.count)
        return BatchResult(shard, rc, res.count)

    _ingest_general.__qualname__ = "Log.ingest"

    def _ingest_failed(self, stream: str, rc: int, index: int | None, line: int, offset: int,
                       reason: str) -> NoReturn:
        """Raises the error of a fast ingest (the fields of comet_ingest_result)."""
        self._forget_if_deleted(stream, rc)
        raise body_error(rc, index, line, offset, reason)

    def _compress(self, payload: bytes) -> tuple[bytes, int]:
        packed = self._codec.compressor.compress(payload)
        if len(packed) < len(payload):
            return packed, _COMPRESSED
        return payload, 0

    def _append_compressed(self, s: _Stream, shard: int, payloads: Sequence[Buffer],
                           durability: str | None, wait: bool) -> BatchResult:
        threshold = self._threshold
        items: list[bytes] = []
        flags = bytearray(len(payloads))
        for i, p in enumerate(payloads):
            p = as_bytes(p)
            if threshold <= len(p) <= self.config.max_entry_bytes:
                p, flags[i] = self._compress(p)
            items.append(p)
        lens = array("I", map(len, items))
        data = b"".join(items)
        try:
            rc = lib.comet_append_batch(s.ptr, shard, data, ffi.from_buffer("uint32_t[]", lens),
                                        ffi.from_buffer("uint8_t[]", flags), len(items),
                                        DURABILITY_CODES[durability], _mode(wait))
        except OverflowError:
            raise s.out_of_range(shard) from None
        if rc < 0:
            self._raise(s.name, rc, shard)
        return BatchResult(shard, rc, len(items))

    # ---- reads ---------------------------------------------------------------------

    def read(self, stream: str, shard: int, from_entry: int = 0, max_entries: int = 1000,
             max_bytes: int = DEFAULT_READ_BYTES, *, durable_only: bool = False,
             into: Any = None) -> ReadBatch:
        """Up to ``max_entries`` entries of one shard from ``from_entry``, lock-free.

        Payloads come back decompressed.  At least one entry is returned when
        one exists, even if it is larger than ``max_bytes``.  ``into``, a
        writable buffer (a bytearray, a pyarrow buffer...), receives the
        payloads directly and ``data`` is then a view of it instead of a copy
        (unless the first entry alone does not fit in it).
        """
        flags = lib.COMET_READ_DURABLE_ONLY if durable_only else 0
        scratch, res, data = self._read(stream, shard, from_entry, max_entries, max_bytes, flags,
                                        into)
        n = res.count
        return ReadBatch(stream, shard, data, scratch.offsets[: n + 1], scratch.entries[:n],
                         scratch.timestamps[:n], res.next_entry, res.skipped, res.limit_entry)

    def read_ndjson(self, stream: str, shard: int, from_entry: int = 0, max_entries: int = 1000,
                    max_bytes: int = DEFAULT_READ_BYTES, *, into: Any = None) -> NdjsonBatch:
        """Like ``read``, with the payloads joined by newlines in one buffer
        (each followed by ``\n``) - ready to ship when ``newline_payloads``
        is 0, with no per-entry work in Python."""
        scratch, res, data = self._read(stream, shard, from_entry, max_entries, max_bytes,
                                        lib.COMET_READ_NEWLINES, into)
        n = res.count
        return NdjsonBatch(stream, shard, data, scratch.entries[:n], scratch.timestamps[:n],
                           res.next_entry, res.skipped, res.newline_payloads)

    def _read(self, stream: str, shard: int, from_entry: int, max_entries: int, max_bytes: int,
              flags: int, into: Any = None) -> tuple[_Scratch, Any, bytes | memoryview]:
        """One comet_read into this thread's scratch buffers (grown as needed),
        or its payloads into ``into``; returns the payload bytes as well."""
        s = self._streams.get(stream) or self._open_stream(stream, create=False)
        if max_entries <= 0:
            raise ValueError("max_entries must be positive")
        if from_entry < 0:
            raise ValueError("from_entry must be >= 0")
        scratch = self._scratch
        scratch.ensure(min(max(max_bytes, 1 << 16), MAX_SCRATCH_BYTES), max_entries)
        req, res = scratch.req, scratch.res
        req.from_entry = from_entry
        req.max_entries = max_entries
        req.max_bytes = max_bytes
        req.flags = flags
        if into is not None:
            view = memoryview(into)
            if view.readonly:
                raise TypeError("read(into=...) needs a writable buffer, such as a bytearray")
            req.data = ffi.cast("uint8_t *", ffi.from_buffer(view, require_writable=True))
            req.data_capacity = len(view)
            try:
                rc = lib.comet_read(s.ptr, shard, req, res)
            except OverflowError:
                raise s.out_of_range(shard) from None
            finally:
                req.data = ffi.cast("uint8_t *", scratch._data_ptr)
                req.data_capacity = scratch.capacity
            if rc >= 0:
                return scratch, res, view[: res.data_bytes]
            if rc != _BUFFER_TOO_SMALL:
                self._raise(stream, rc)
        while True:
            try:
                rc = lib.comet_read(s.ptr, shard, req, res)
            except OverflowError:
                raise s.out_of_range(shard) from None
            if rc != _BUFFER_TOO_SMALL:
                break
            scratch.ensure(res.needed_bytes, max_entries)
        if rc < 0:
            self._raise(stream, rc)
        return scratch, res, bytes(memoryview(scratch.data)[: res.data_bytes])

    def iter_entries(self, stream: str, shard: int, from_entry: int = 0,
                     batch: int = 1000) -> Iterator[ReadBatch]:
        """Batches from ``from_entry`` up to the committed end at the time of each read."""
        while True:
            got = self.read(stream, shard, from_entry, batch)
            if not len(got) and got.next_entry == from_entry:
                return
            yield got
            from_entry = got.next_entry

    def find_time(self, stream: str, shard: int, timestamp_ns: int) -> int:
        """First entry whose timestamp is at or after ``timestamp_ns``."""
        s = self._streams.get(stream) or self._open_stream(stream, create=False)
        rc = lib.comet_find_time(s.ptr, shard, timestamp_ns)
        if rc < 0:
            self._raise(stream, rc)
        return rc

    def entry_timestamp(self, stream: str, shard: int, entry: int) -> int:
        """When ``entry`` was stored (the oldest stored entry's time when it was
        deleted); 0 when it does not exist (yet)."""
        s = self._streams.get(stream) or self._open_stream(stream, create=False)
        rc = lib.comet_entry_timestamp(s.ptr, shard, entry)
        if rc < 0:
            self._raise(stream, rc)
        return rc

    # ---- consumer groups and retention ---------------------------------------------

    def backlogs(self, stats: StreamStats) -> dict[str, GroupBacklog]:
        """What each group of a stream has not acknowledged (``stats`` from
        ``stats()``): entries, bytes (each shard's lag times its mean entry
        size, as appended: an estimate that costs no read) and the time of
        the oldest such entry (read from its header: this opens the shards
        where a group lags)."""
        shards = {s.shard: s for s in stats.shards}
        out: dict[str, GroupBacklog] = {}
        for g in stats.groups:
            seen = out.get(g.name) or GroupBacklog(0, 0, 0)
            oldest, size = 0, 0
            shard = shards.get(g.shard)
            if g.lag and shard is not None:
                oldest = self.entry_timestamp(stats.stream, g.shard, g.offset)
                if shard.appended_entries:
                    size = g.lag * shard.appended_raw_bytes // shard.appended_entries
            out[g.name] = GroupBacklog(
                seen.entries + g.lag, seen.bytes + size,
                min(x for x in (seen.oldest_ns, oldest) if x) if seen.oldest_ns or oldest else 0)
        return out

    def group(self, stream: str, shard: int, name: str, *, create: bool = True) -> Group:
        """The offset of group ``name`` in one shard, registering it there when
        ``create`` (a new group starts at the oldest stored entry)."""
        s = self._streams.get(stream) or self._open_stream(stream, create=False)
        raw = name.encode("utf-8", "surrogateescape") if isinstance(name, str) else name
        out = ffi.new("comet_group **")
        try:
            rc = lib.comet_group_open(s.ptr, shard, raw, len(raw), 1 if create else 0, out)
        except OverflowError:
            raise s.out_of_range(shard) from None
        if rc < 0:
            self._raise(stream, rc)
        return Group(stream, shard, name, out[0])

    def groups(self, stream: str, shard: int | None = None) -> list[GroupInfo]:
        """Registered groups with their offsets and lag (every shard, or one)."""
        s = self._streams.get(stream) or self._open_stream(stream, create=False)
        out: list[GroupInfo] = []
        buf = ffi.new("comet_group_info[]", lib.COMET_MAX_GROUPS)
        for i in range(s.shards) if shard is None else [shard]:
            n = lib.comet_group_list(s.ptr, i, buf, lib.COMET_MAX_GROUPS)
            if n < 0:
                raise_for(n)
            for k in range(min(n, lib.COMET_MAX_GROUPS)):
                g = buf[k]
                out.append(GroupInfo(ffi.string(g.name).decode(), i, g.offset, g.lag, g.last_ack_ns,
                                     g.registered_ns, g.acks, g.delivered, g.retries, g.failed,
                                     g.last_delivery_ns))
        return out

    def delete_group(self, stream: str, name: str) -> None:
        """Unregisters a group from every shard (retention stops protecting for it)."""
        s = self._streams.get(stream) or self._open_stream(stream, create=False)
        raw = name.encode("utf-8", "surrogateescape")
        rc = lib.comet_group_delete(s.ptr, raw, len(raw))
        if rc < 0:
            self._raise(stream, rc)

    def data_bytes(self) -> int:
        """Bytes of the segment and index files: what retention_max_total_bytes counts."""
        self._check_open()
        rc = lib.comet_data_bytes(self._db)
        if rc < 0:
            raise_for(rc)
        return int(rc)

    def run_retention(self, room: int = 0) -> RetentionReport:
        """A retention pass now, over the shards this process owns; with
        ``room``, also deletes what the policy allows until that many more
        bytes fit in retention_max_total_bytes."""
        self._check_open()
        out = ffi.new("comet_retention_report *")
        rc = lib.comet_run_retention_room(self._db, room, out)
        if rc < 0:
            raise_for(rc)
        return RetentionReport(out.deleted_segments, out.deleted_bytes, out.lost_entries,
                               out.protected_segments)

    # ---- durability and inspection -------------------------------------------------

    def retention_lost_entries(self) -> int:
        """Entries this process's retention deleted before every registered
        group had them (``retention_force_delete_after_ms``), since it opened
        the directory (per stream: ``ShardStats.retention_lost_entries``)."""
        self._check_open()
        return int(lib.comet_retention_lost(self._db))

    def sync(self, stream: str | None = None, shard: int | None = None) -> None:
        """fdatasync what is committed (one stream, one shard, or everything open)."""
        self._check_open()
        if stream is None:
            rc = lib.comet_sync_all(self._db)
        else:
            s = self._streams.get(stream) or self._open_stream(stream, create=False)
            rc = lib.comet_sync(s.ptr, -1 if shard is None else shard)
        if rc < 0:
            raise_for(rc)

    def shard_stats(self, stream: str, shard: int, oldest: bool = True) -> ShardStats:
        """``oldest=False``: oldest_timestamp is left 0 (it reads the shard's first
        entry: a disk read per shard when listing many streams)."""
        s = self._streams.get(stream) or self._open_stream(stream, create=False)
        out = ffi.new("comet_shard_stats *")
        rc = lib.comet_shard_stats_get(s.ptr, shard, lib.COMET_STATS_ALL if oldest else 0, out)
        if rc < 0:
            self._raise(stream, rc)
        return ShardStats(shard, *_STATS_LAYOUT.unpack(ffi.buffer(out)))

    def stats(self, stream: str, oldest: bool = True) -> StreamStats:
        """Statistics of every shard of a stream, from the shared state
        (``oldest``: as for shard_stats)."""
        count = self.shard_count(stream)
        return StreamStats(stream, [self.shard_stats(stream, i, oldest) for i in range(count)],
                           self.groups(stream))

    def verify(self, stream: str | None = None) -> VerifyReport:
        """Checks every entry's checksum and number; read-only apart from recovery."""
        report = VerifyReport()
        out = ffi.new("comet_verify_report *")
        for name in [stream] if stream else self.streams():
            s = self._streams.get(name) or self._open_stream(name, create=False)
            for shard in range(s.shards):
                rc = lib.comet_verify_shard(s.ptr, shard, out)
                if rc < 0:
                    self._raise(name, rc)
                report.segments += out.segments
                report.entries += out.entries
                report.bytes += out.bytes
                report.bad_entries += out.bad_entries
                report.index_problems += out.index_problems
                for i in range(out.problem_count):
                    p = out.problems[i]
                    report.problems.append(Problem(name, shard, p.segment_base, p.offset, p.entry))
        return report
