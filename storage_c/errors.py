"""Exceptions raised by the storage API, one per stable C error code, and
the translation of a C return code into one.

Each carries ``code`` (the C code) and a message naming what was wrong: the
stream, the shard, the limit, the file; a refused request body also carries
where it went wrong (``fault``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NoReturn

from ._comet import ffi, lib


@dataclass(frozen=True)
class BodyFault:
    """Where an ingested body went wrong: the first bad event's index (None
    when the fault lies outside every event), its 1-based line, the byte
    offset of the fault in the decoded body, and what was wrong."""

    index: int | None
    line: int
    offset: int
    reason: str

    def __str__(self) -> str:
        where = f"line {self.line}, byte {self.offset}"
        if self.index is not None:
            where = f"event {self.index} ({where})"
        return f"{where}: {self.reason}"


class CometError(Exception):
    """Base of every storage error.  ``fault`` is set by ``Log.ingest`` for a
    bad body (InvalidJSON, EntryTooLarge, NoEvents)."""

    code: int = 0
    fault: BodyFault | None = None

    def __init__(self, message: str, code: int | None = None,
                 fault: BodyFault | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.fault = fault


class InvalidArgument(CometError, ValueError):
    code = lib.COMET_E_INVALID


class StreamNameError(CometError, ValueError):
    code = lib.COMET_E_STREAM_NAME


class ShardRangeError(CometError, IndexError):
    code = lib.COMET_E_SHARD_RANGE


class EntryTooLarge(CometError, ValueError):
    code = lib.COMET_E_ENTRY_TOO_LARGE


class ShardCountMismatch(CometError):
    code = lib.COMET_E_SHARD_COUNT


class FormatVersionError(CometError):
    code = lib.COMET_E_FORMAT_VERSION


class CorruptionError(CometError):
    code = lib.COMET_E_CORRUPT


class StorageFull(CometError, OSError):
    code = lib.COMET_E_STORAGE_FULL


class StorageIOError(CometError, OSError):
    code = lib.COMET_E_IO


class NoFreeSlot(CometError):
    code = lib.COMET_E_NO_SLOT


class StreamNotFound(CometError, KeyError):
    code = lib.COMET_E_NO_STREAM

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class Closed(CometError):
    code = lib.COMET_E_CLOSED


class ProcessCountMismatch(CometError):
    code = lib.COMET_E_PROCESS_COUNT


class BatchTooLarge(CometError, ValueError):
    code = lib.COMET_E_BATCH_TOO_LARGE


class DecompressionError(CometError):
    code = lib.COMET_E_DECOMPRESS


class SlotAlreadyHeld(CometError):
    code = lib.COMET_E_SLOT_HELD


class GroupNameError(CometError, ValueError):
    code = lib.COMET_E_GROUP_NAME


class TooManyGroups(CometError):
    code = lib.COMET_E_TOO_MANY_GROUPS


class GroupNotFound(CometError, KeyError):
    code = lib.COMET_E_NO_GROUP

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class AckGapError(CometError, ValueError):
    code = lib.COMET_E_ACK_GAP


class InvalidJSON(CometError, ValueError):
    """An ingested body is not valid JSON; ``where`` says which event, line and byte."""

    code = lib.COMET_E_BAD_JSON


class StreamLimit(CometError):
    """Creating the stream would pass the data directory's max_streams."""

    code = lib.COMET_E_STREAM_LIMIT


class NoEvents(CometError, ValueError):
    """An ingested body holds no event (empty, only blank lines, or ``[]``)."""

    code = lib.COMET_E_NO_EVENTS


class IdempotencyKeyReused(CometError, ValueError):
    """An idempotency key already stored another request's batch (a different
    body) within its window: nothing was stored."""

    code = lib.COMET_E_KEY_REUSED


class WouldBlock(CometError):
    """An append called with ``wait=False`` would have had to wait (for the
    shard's lock, a rotation, a sync): nothing was stored; make the call
    again with ``wait=True``, off the event loop, and ``shard=`` this
    ``shard`` (the shard the call had chosen, so that the retry of a call
    without one does not take the next shard in turn)."""

    code = lib.COMET_E_WOULD_BLOCK
    shard: int | None = None


class InvalidOTLP(CometError, ValueError):
    """An OTLP export request refused whole (storage_c.otlp.decode): protobuf
    would not parse it, a value nests deeper than the limit, or it uses
    key_strindex or string_value_strindex.  ``offset`` is the byte of the body
    where decoding failed, ``reason`` what was wrong there."""

    code = lib.COMET_E_BAD_OTLP
    offset: int = 0
    reason: str = ""


class TooManyOpenShards(CometError):
    """Every shard this process has open is in use by a call, and its budget
    (Config.max_open_shards, bounded by the file limit) allows no other: nothing
    was done; the call may be made again once one is released."""

    code = lib.COMET_E_TOO_MANY_OPEN


class SyncFailed(StorageIOError):
    """A sync (fsync, fdatasync, msync) of the shard failed earlier, in this
    process or another: the kernel may have dropped the data it could not
    write, so the shard refuses appends until it is opened again, when its
    tail after the last durable point is checked (storage_c/FORMAT.md)."""

    code = lib.COMET_E_SYNC_FAILED


class StorageGone(StorageIOError):
    """A file or directory of the data directory was removed while in use
    (the data directory, a stream's or a shard's directory, a segment)."""

    code = lib.COMET_E_GONE


class ReadOnlyStorage(StorageIOError):
    """The filesystem holding the data directory is read-only (EROFS)."""

    code = lib.COMET_E_READ_ONLY


_BY_CODE: dict[int, type[CometError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        StreamNameError,
        ShardRangeError,
        EntryTooLarge,
        ShardCountMismatch,
        FormatVersionError,
        CorruptionError,
        StorageFull,
        StorageIOError,
        NoFreeSlot,
        StreamNotFound,
        Closed,
        ProcessCountMismatch,
        BatchTooLarge,
        DecompressionError,
        SlotAlreadyHeld,
        GroupNameError,
        TooManyGroups,
        GroupNotFound,
        AckGapError,
        InvalidJSON,
        NoEvents,
        SyncFailed,
        StorageGone,
        ReadOnlyStorage,
        StreamLimit,
        WouldBlock,
        InvalidOTLP,
        IdempotencyKeyReused,
        TooManyOpenShards,
    )
}
_BY_CODE[lib.COMET_E_NOMEM] = CometError
_BODY_CODES = (lib.COMET_E_BAD_JSON, lib.COMET_E_ENTRY_TOO_LARGE, lib.COMET_E_NO_EVENTS)


def error_for(code: int) -> CometError:
    """The exception for a negative C return code, with the thread's detail."""
    detail = ffi.string(lib.comet_last_error()).decode("utf-8", "replace")
    summary = ffi.string(lib.comet_strerror(code)).decode()
    cls = _BY_CODE.get(code, CometError)
    return cls(detail or summary, code)


def raise_for(code: int) -> NoReturn:
    raise error_for(code)


def body_error(code: int, index: int | None, line: int, offset: int, reason: str) -> CometError:
    """The exception for a request body the core refused (InvalidJSON,
    EntryTooLarge, NoEvents), its message and ``fault`` saying where: the
    fields of a comet_ingest_result.  Any other code as error_for."""
    if code not in _BODY_CODES:
        return error_for(code)
    fault = BodyFault(index, line, offset, reason)
    exc = error_for(code)
    return type(exc)(str(fault), code, fault)


def ingest_error(code: int, res: Any) -> CometError:
    """body_error from a ``comet_ingest_result *``."""
    index = None if res.error_index == lib.COMET_NO_INDEX else int(res.error_index)
    return body_error(code, index, int(res.error_line), int(res.error_offset),
                      ffi.string(res.error_reason).decode("utf-8", "replace"))
