"""Configuration of a data directory, with the defaults of the specification."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ._comet import ffi, lib
from .errors import raise_for

Durability = Literal["none", "interval", "always"]

DURABILITY_CODES: dict[str | None, int] = {
    None: lib.COMET_DURABILITY_DEFAULT,
    "none": lib.COMET_DURABILITY_NONE,
    "interval": lib.COMET_DURABILITY_INTERVAL,
    "always": lib.COMET_DURABILITY_ALWAYS,
}

MiB = 1 << 20


@dataclass(frozen=True)
class Config:
    """How a process uses a data directory.

    Shard counts and formats live on disk; everything here is per process and
    may change between runs (except that every process sharing the directory
    must agree on ``process_count``).
    """

    shards: int = 16
    """Shard count given to streams this process creates."""
    segment_bytes: int = 16 * MiB
    """Segments rotate at this size."""
    segment_chunk_bytes: int = 4 * MiB
    """A segment's file is allocated as it fills: from 64 KiB, doubling, in steps of
    at most this much (a full disk fails an append at a step, never later)."""
    max_entry_bytes: int = 16 * MiB
    index_interval_bytes: int = 4096
    durability: Durability = "interval"
    fsync_interval_ms: int = 1000
    process_count: int = 1
    """Processes sharing the directory; slot p owns shards with shard % process_count == p."""
    compression_threshold: int = 4096
    """Entries at or above this size are zstd-compressed when that makes them smaller (0: never)."""
    compression_level: int = 3
    create: bool = True
    """Create the data directory if it does not exist."""
    auto_create_streams: bool = True
    max_streams: int = 0
    """Streams the data directory may hold; creating one more raises StreamLimit (0: no limit)."""
    max_open_shards: int = 0
    """Shards this process keeps open at once (descriptors and mappings); the least recently
    used idle one is closed to open another, and when all are in use the call raises
    TooManyOpenShards.  0: min(256, (file limit - 128) / 4)."""
    background_flush: bool = True
    """Run the background thread: flushes, and retention passes (tools that only read turn it off)."""
    retention_max_age_ms: int = 0
    """Delete sealed segments whose entries are all older than this (0: no age limit)."""
    retention_max_shard_bytes: int = 0
    """Delete the oldest segments of a shard above this size (0: no limit)."""
    retention_max_total_bytes: int = 0
    """Budget of the whole data directory: retention keeps under it, and appends that
    cannot fit once nothing more may be deleted fail with StorageFull (0: no budget)."""
    retention_min_segments: int = 1
    retention_protect_unconsumed: bool = True
    """Keep segments holding entries a registered consumer group has not acknowledged..."""
    retention_force_delete_after_ms: int = 0
    """...unless their entries are older than this; then delete and count the loss (0: never)."""
    retention_interval_ms: int = 60_000
    """Period of the background retention pass (0: only when run_retention() is called)."""
    recycle_segments: bool = True
    """Keep one deleted segment file per shard and reuse it as the shard's next segment
    (writes then land on warm pages); False unlinks every deleted segment at once."""

    # ---- presets: how each kind of process opens a data directory ----------------
    # Every process that is not the gateway opens the directory through one of
    # these, so that tools, consumers and Spark jobs agree on what they may do.

    @classmethod
    def writer(cls, **overrides: Any) -> Config:
        """A process that appends (the gateway, a program using ``Log.append``):
        creates the directory and streams, runs the flusher and retention."""
        return cls(**overrides)

    @classmethod
    def reader(cls, **overrides: Any) -> Config:
        """A consumer: reads, registers its group and acknowledges.  It creates
        neither the directory nor streams (a mistyped path is an error, not a
        new empty directory) and runs no retention of its own (the writers
        do), but keeps the flusher: it fdatasyncs the offsets within
        ``fsync_interval_ms`` of an ack, so a power failure rewinds a group by
        at most that much.  ``comet consume``, ``comet ship``, ``Consumer``
        and ``comet spark-ship`` use it."""
        return cls(**{**_READER, **overrides})

    @classmethod
    def inspector(cls, **overrides: Any) -> Config:
        """A tool that looks without registering or acknowledging (``comet
        stat``, ``tail``, ``verify``, the Spark ``comet`` source): creates
        nothing and runs no background thread, so it is safe next to running
        writers.  Something that changes state through it anyway (``comet
        group reset``) calls ``Log.sync`` itself."""
        return cls(**{**_INSPECTOR, **overrides})

    def __post_init__(self) -> None:
        if self.durability not in ("none", "interval", "always"):
            raise ValueError(f"durability must be 'none', 'interval' or 'always', not {self.durability!r}")
        if self.compression_threshold < 0:
            raise ValueError("compression_threshold must be >= 0")
        # The C core's own limits (sizes, retention budget...), checked here so
        # that a bad setting fails where it is made, not at the first open.
        rc = lib.comet_config_check(self.to_c())
        if rc < 0:
            raise_for(rc)

    def to_c(self) -> Any:
        """A ``comet_config *`` for comet_open (validated again in C)."""
        cfg = ffi.new("comet_config *")
        lib.comet_config_default(cfg)
        fields = {
            "segment_bytes": self.segment_bytes,
            "segment_chunk_bytes": self.segment_chunk_bytes,
            "max_streams": self.max_streams,
            "max_open_shards": self.max_open_shards,
            "max_entry_bytes": self.max_entry_bytes,
            "index_interval_bytes": self.index_interval_bytes,
            "default_shards": self.shards,
            "fsync_interval_ms": self.fsync_interval_ms,
            "process_count": self.process_count,
            "retention_max_age_ms": self.retention_max_age_ms,
            "retention_max_shard_bytes": self.retention_max_shard_bytes,
            "retention_max_total_bytes": self.retention_max_total_bytes,
            "retention_force_delete_after_ms": self.retention_force_delete_after_ms,
            "retention_min_segments": self.retention_min_segments,
            "retention_protect_unconsumed": int(self.retention_protect_unconsumed),
            "retention_interval_ms": self.retention_interval_ms,
        }
        for name, value in fields.items():
            try:
                setattr(cfg, name, value)
            except (OverflowError, TypeError):
                raise ValueError(f"{name}={value!r} is out of range") from None
        cfg.durability = DURABILITY_CODES[self.durability]
        flags = 0
        if self.create:
            flags |= lib.COMET_OPEN_CREATE
        if not self.background_flush:
            flags |= lib.COMET_OPEN_NO_FLUSHER
        if not self.recycle_segments:
            flags |= lib.COMET_OPEN_NO_RECYCLE
        cfg.flags = flags
        return cfg


_READER: dict[str, Any] = {"create": False, "auto_create_streams": False, "background_flush": True,
                           "retention_interval_ms": 0}
_INSPECTOR: dict[str, Any] = {"create": False, "auto_create_streams": False,
                              "background_flush": False, "retention_interval_ms": 0}
