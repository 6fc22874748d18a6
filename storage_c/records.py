"""Plain result types of the storage API, and the type of what it takes as a
payload or body."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Iterator, NamedTuple, TypeAlias

import xxhash

Buffer: TypeAlias = bytes | bytearray | memoryview
"""What the append and ingest methods of ``Log`` take as a payload or body."""


def as_bytes(payload: object) -> bytes:
    """A Buffer as bytes (TypeError for anything else)."""
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, (bytearray, memoryview)):
        return bytes(payload)
    raise TypeError(f"payloads are bytes-like, not {type(payload).__name__}")


class BatchResult(NamedTuple):
    """Where an append put its entries: ids ``shard-first`` .. ``shard-(first+count-1)``."""

    shard: int
    first: int
    count: int  # type: ignore[assignment]  # the field shadows tuple.count on purpose

    @property
    def last(self) -> int:
        return self.first + self.count - 1

    @property
    def replayed(self) -> bool:
        """Whether an idempotency key had stored this batch before (nothing stored now)."""
        return False


class ReplayedBatch(BatchResult):
    """The batch an idempotency key stored before: this call stored nothing."""

    __slots__ = ()

    @property
    def replayed(self) -> bool:
        return True


class IdempotencyKey(NamedTuple):
    """An ingest's idempotency key (comet.h, comet_idempotency): 16 bytes of a
    hash of the client's key, 16 of a hash of what the request asks to store,
    and how long the key stays a duplicate."""

    key: bytes
    digest: bytes
    window_ms: int

    @classmethod
    def of(cls, key: str | bytes, window_s: float, *content: Buffer) -> IdempotencyKey:
        """XXH3-128 of the key and of ``content`` (what the request asks to
        store, as the caller defines it: the same request gives the same bytes).
        Not a cryptographic hash: it tells a retry from another request under
        the same key, and whoever may send a key may store anyway."""
        raw = key.encode() if isinstance(key, str) else key
        digest = xxhash.xxh3_128()
        for part in content:
            digest.update(part)
        return cls(xxhash.xxh3_128_digest(raw), digest.digest(), max(1, int(window_s * 1000)))


class Entry(NamedTuple):
    shard: int
    entry: int
    timestamp: int
    """Unix nanoseconds."""
    payload: bytes

    @property
    def id(self) -> str:
        """The message id's text form, ``"<shard>-<entry>"``."""
        return f"{self.shard}-{self.entry}"


class ReadBatch:
    """Entries of one shard from one read, kept columnar.

    ``data`` (bytes, or a view of the caller's buffer after ``read(into=...)``)
    holds the payloads back to back and ``offsets`` (int32, count + 1,
    Arrow's binary layout) delimits them; ``payloads`` slices them into bytes
    objects on first use.  ``next_entry`` is where the following read starts;
    ``skipped`` counts entries that could not be returned (damaged, or deleted
    by retention) - they are never skipped silently.
    """

    __slots__ = ("stream", "shard", "data", "offsets", "entries", "timestamps", "next_entry",
                 "skipped", "limit_entry", "_payloads")

    def __init__(self, stream: str, shard: int, data: bytes | memoryview, offsets: array, entries: array,
                 timestamps: array, next_entry: int, skipped: int, limit_entry: int = -1) -> None:
        self.stream = stream
        self.shard = shard
        self.data = data
        self.offsets = offsets
        self.entries = entries
        self.timestamps = timestamps
        self.next_entry = next_entry
        self.skipped = skipped
        self.limit_entry = next_entry if limit_entry < 0 else limit_entry
        """The committed (``durable_only``: durable) end the read was bounded by:
        below it, the read stopped at ``max_entries`` or ``max_bytes``."""
        self._payloads: list[bytes] | None = None

    @classmethod
    def empty(cls, stream: str, shard: int, next_entry: int = 0) -> ReadBatch:
        return cls(stream, shard, b"", array("i", [0]), array("q"), array("q"), next_entry, 0)

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def payloads(self) -> list[bytes]:
        if self._payloads is None:
            data = self.data if type(self.data) is bytes else bytes(self.data)
            bounds = self.offsets.tolist()  # a comprehension over ints beats map(slice, ...)
            following = iter(bounds)
            next(following, None)
            self._payloads = [data[a:b] for a, b in zip(bounds, following)]
        return self._payloads

    def __iter__(self) -> Iterator[Entry]:
        shard = self.shard
        return (Entry(shard, e, t, p) for e, t, p in zip(self.entries, self.timestamps, self.payloads))

    def __getitem__(self, i: int) -> Entry:
        return Entry(self.shard, self.entries[i], self.timestamps[i], self.payloads[i])

    def __repr__(self) -> str:
        return (f"ReadBatch(stream={self.stream!r}, shard={self.shard}, count={len(self)}, "
                f"next_entry={self.next_entry}, skipped={self.skipped})")


class NdjsonBatch(NamedTuple):
    """Entries of one shard as one NDJSON buffer: every payload followed by a
    newline.  ``newline_payloads`` counts payloads that hold a newline
    themselves (their lines are not NDJSON)."""

    stream: str
    shard: int
    data: bytes | memoryview
    entries: array
    timestamps: array
    next_entry: int
    skipped: int
    newline_payloads: int


@dataclass(frozen=True)
class ShardStats:
    """Counters of one shard, as stored in its shared state (SPEC 3.8)."""

    shard: int
    first_entry: int
    next_entry: int
    durable_entry: int
    segments: int
    disk_bytes: int
    active_bytes: int
    oldest_timestamp: int
    newest_timestamp: int
    appends: int
    appended_entries: int
    appended_raw_bytes: int
    appended_stored_bytes: int
    compressed_entries: int
    append_latency_sum_ns: int
    append_latency_count: int
    append_latency_max_ns: int
    rotations: int
    syncs: int
    lock_owner_died: int
    recoveries: int
    truncated_bytes: int
    truncated_entries: int
    orphaned_segments: int
    state_rebuilds: int
    index_rebuilds: int
    crc_failures: int
    skipped_entries: int
    storage_full_errors: int
    retention_deleted_segments: int
    retention_deleted_bytes: int
    retention_lost_entries: int
    recycled_segments: int
    sync_failures: int
    sync_failed_errno: int
    """Nonzero (the errno of the first failure): a sync of the shard failed and
    it refuses appends (SyncFailed) until it is opened again."""
    key_replays: int
    """Keyed appends answered with the batch their idempotency key stored before."""

    @property
    def entries(self) -> int:
        """Entries stored now."""
        return self.next_entry - self.first_entry


@dataclass(frozen=True)
class StreamStats:
    stream: str
    shards: list[ShardStats]
    groups: list["GroupInfo"] = field(default_factory=list)

    @property
    def entries(self) -> int:
        return sum(s.entries for s in self.shards)

    def total(self, name: str) -> int:
        """Sum of a counter over the shards."""
        return sum(getattr(s, name) for s in self.shards)

    @property
    def oldest_timestamp(self) -> int:
        stamps = [s.oldest_timestamp for s in self.shards if s.entries]
        return min(stamps) if stamps else 0

    @property
    def newest_timestamp(self) -> int:
        return max((s.newest_timestamp for s in self.shards), default=0)

    def group_lag(self) -> dict[str, GroupLag]:
        """Each registered group summed over its shards, by name (sorted):
        what ``comet stat``, ``GET /streams/{name}`` and the
        ``comet_consumer_lag`` metric report."""
        out: dict[str, GroupLag] = {}
        for g in sorted(self.groups, key=lambda g: (g.name, g.shard)):
            seen = out.get(g.name) or GroupLag(g.name, 0, 0, 0)
            out[g.name] = GroupLag(g.name, seen.shards + 1, seen.lag + g.lag,
                                   max(seen.last_ack_ns, g.last_ack_ns),
                                   seen.delivered + g.delivered, seen.retries + g.retries,
                                   seen.failed + g.failed,
                                   max(seen.last_delivery_ns, g.last_delivery_ns))
        return out


@dataclass(frozen=True)
class GroupInfo:
    """A consumer group's position in one shard."""

    name: str
    shard: int
    offset: int
    """Next entry to consume; entries below it are acknowledged."""
    lag: int
    last_ack_ns: int
    registered_ns: int
    acks: int
    delivered: int = 0
    """Records the group's consumer reported delivered (``Group.count``)."""
    retries: int = 0
    failed: int = 0
    """Records it gave up on (dead letters)."""
    last_delivery_ns: int = 0


@dataclass(frozen=True)
class GroupLag:
    """A consumer group over every shard where it is registered."""

    name: str
    shards: int
    """Shards where the group is registered."""
    lag: int
    """Entries committed in those shards and not yet acknowledged by the group."""
    last_ack_ns: int
    """The latest acknowledgement in any of them (0: none yet)."""
    delivered: int = 0
    retries: int = 0
    failed: int = 0
    last_delivery_ns: int = 0


@dataclass(frozen=True)
class GroupBacklog:
    """What a consumer group has not acknowledged, over its shards."""

    entries: int
    bytes: int
    """Estimated: each shard's lag times its mean entry size as appended."""
    oldest_ns: int
    """When the oldest unacknowledged entry was stored (0: none)."""


@dataclass(frozen=True)
class RetentionReport:
    deleted_segments: int = 0
    deleted_bytes: int = 0
    lost_entries: int = 0
    """Entries deleted before every registered group had consumed them (forced)."""
    protected_segments: int = 0
    """Segments kept only because a registered group still needs them."""


@dataclass(frozen=True)
class Problem:
    stream: str
    shard: int
    segment_base: int
    offset: int
    entry: int


@dataclass
class VerifyReport:
    """What ``verify`` found: good entries, entries lost to damage, and where.

    ``index_problems`` counts sparse indexes that disagreed with their segment;
    they are derived data and were rebuilt, so they do not make a report bad.
    """

    segments: int = 0
    entries: int = 0
    bytes: int = 0
    bad_entries: int = 0
    index_problems: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.bad_entries == 0
