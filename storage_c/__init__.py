"""Comet storage: an embedded, multi-process, segmented log with a C core.

    from storage_c import Log, Config

    with Log("./data", Config(shards=8)) as log:
        shard, entry = log.append("events", b'{"level": "info"}')
        batch = log.read("events", shard, entry)
"""

from .checksum import crc32c
from .config import Config, Durability
from .errors import (
    BodyFault,
    InvalidJSON,
    InvalidOTLP,
    NoEvents,
    BatchTooLarge,
    Closed,
    CometError,
    CorruptionError,
    DecompressionError,
    EntryTooLarge,
    AckGapError,
    FormatVersionError,
    GroupNameError,
    GroupNotFound,
    InvalidArgument,
    TooManyGroups,
    NoFreeSlot,
    ProcessCountMismatch,
    ShardCountMismatch,
    ShardRangeError,
    SlotAlreadyHeld,
    StorageFull,
    StorageIOError,
    SyncFailed,
    StorageGone,
    ReadOnlyStorage,
    StreamNameError,
    StreamLimit,
    TooManyOpenShards,
    WouldBlock,
    StreamNotFound,
    IdempotencyKeyReused,
)
from .group_admin import ResetResult, ResetTo, delete_group, reset_group
from .groups import Group, check_group_name
from .log import Log, check_stream_name
from .otlp import Decoded
from .otlp import decode as decode_otlp
from .records import (
    BatchResult,
    Entry,
    IdempotencyKey,
    ReplayedBatch,
    GroupBacklog,
    GroupInfo,
    GroupLag,
    Problem,
    ReadBatch,
    RetentionReport,
    ShardStats,
    StreamStats,
    VerifyReport,
)
from ._comet import lib as _lib
from .split import compact_ndjson, split_json

API_VERSION: int = _lib.COMET_API_VERSION
"""The version of the core's C API (comet.h)."""
FORMAT_VERSION: int = _lib.COMET_FORMAT_VERSION
"""The version of the data directory's format (FORMAT.md)."""
SEGMENT_VERSION: int = _lib.COMET_SEGMENT_VERSION
"""The version of the segment files' format (FORMAT.md)."""

__all__ = [
    "API_VERSION",
    "FORMAT_VERSION",
    "SEGMENT_VERSION",
    "compact_ndjson",
    "AckGapError",
    "BatchResult",
    "BodyFault",
    "BatchTooLarge",
    "Closed",
    "CometError",
    "Config",
    "CorruptionError",
    "Decoded",
    "DecompressionError",
    "Durability",
    "Entry",
    "EntryTooLarge",
    "FormatVersionError",
    "Group",
    "GroupBacklog",
    "GroupInfo",
    "GroupLag",
    "GroupNameError",
    "GroupNotFound",
    "IdempotencyKey",
    "IdempotencyKeyReused",
    "InvalidArgument",
    "InvalidJSON",
    "InvalidOTLP",
    "Log",
    "NoEvents",
    "NoFreeSlot",
    "Problem",
    "ProcessCountMismatch",
    "ReadBatch",
    "ReplayedBatch",
    "ResetResult",
    "ResetTo",
    "RetentionReport",
    "ShardCountMismatch",
    "ShardRangeError",
    "ShardStats",
    "SlotAlreadyHeld",
    "StorageFull",
    "StorageIOError",
    "SyncFailed",
    "StorageGone",
    "ReadOnlyStorage",
    "StreamNameError",
    "StreamLimit",
    "TooManyOpenShards",
    "WouldBlock",
    "StreamNotFound",
    "StreamStats",
    "TooManyGroups",
    "VerifyReport",
    "check_group_name",
    "crc32c",
    "decode_otlp",
    "check_stream_name",
    "delete_group",
    "reset_group",
    "split_json",
]
