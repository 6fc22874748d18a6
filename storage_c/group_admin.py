"""Consumer groups across the shards of a stream: move a group's offsets
(to the oldest entry, the end, an entry number, a time) or unregister it, in
every shard where it is registered, through a ``Log`` like any other caller.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Literal

from .errors import GroupNotFound
from .log import Log


@dataclass(frozen=True)
class ResetTo:
    """Where ``reset_group`` moves a group: the oldest stored entry, the end,
    an entry number, or the first entry at or after a time (unix ns), found
    through the sparse index (like Kafka's offsets-for-times)."""

    kind: Literal["earliest", "latest", "entry", "time"]
    value: int = 0

    @classmethod
    def time(cls, text: str) -> ResetTo:
        """ISO 8601 (a time without a zone is UTC), or unix seconds."""
        try:
            return cls("time", int(float(text) * 1e9))
        except ValueError:
            pass
        try:
            when = datetime.fromisoformat(text.strip())
        except ValueError:
            raise ValueError(f"{text!r} is neither an ISO 8601 time (2026-11-25T10:00:00Z) "
                             "nor unix seconds") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        return cls("time", int(when.timestamp()) * 1_000_000_000 + when.microsecond * 1000)

    def __str__(self) -> str:
        if self.kind == "entry":
            return f"entry {self.value}"
        if self.kind == "time":
            return datetime.fromtimestamp(self.value / 1e9, timezone.utc).isoformat()
        return self.kind


@dataclass(frozen=True)
class ResetResult:
    shard: int
    before: int
    after: int


def _shards_of(log: Log, stream: str, group: str, shard: int | None) -> list[int]:
    """The shards where ``group`` is registered (GroupNotFound naming the
    known groups when there is none)."""
    infos = log.groups(stream, shard)
    shards = sorted({g.shard for g in infos if g.name == group})
    if not shards:
        known = sorted({g.name for g in log.groups(stream)})
        where = f"stream {stream!r}" + ("" if shard is None else f" shard {shard}")
        raise GroupNotFound(f"consumer group {group!r} is not registered on {where}; known "
                            f"groups: {', '.join(known) if known else '(none)'}")
    return shards


def reset_group(log: Log, stream: str, group: str, to: ResetTo,
                shard: int | None = None) -> list[ResetResult]:
    """Moves ``group`` in every shard where it is registered (or one shard).

    A consumer that is running notices at its next read, which starts at the
    group's offset; an acknowledgement of a batch it read before the reset is
    refused if it would skip entries (``ack_range``), so a reset backwards is
    not undone by it."""
    out = []
    for s in _shards_of(log, stream, group, shard):
        g = log.group(stream, s, group, create=False)
        stats = log.shard_stats(stream, s)
        if to.kind == "earliest":
            target = stats.first_entry
        elif to.kind == "latest":
            target = stats.next_entry
        elif to.kind == "entry":
            target = min(max(to.value, stats.first_entry), stats.next_entry)
        else:
            target = log.find_time(stream, s, to.value)
        before = g.offset
        out.append(ResetResult(s, before, g.reset(target)))
    return out


def delete_group(log: Log, stream: str, group: str) -> list[int]:
    """Unregisters ``group`` from every shard; returns the shards it was in."""
    shards = _shards_of(log, stream, group, None)
    log.delete_group(stream, group)
    return shards
