"""Consumer-group offsets of one shard, as a small handle over the C table.

An offset is the next entry the group has to consume.  ``ack`` moves it past
an entry and never backwards (whatever order concurrent acks come in);
``ack_range`` refuses to skip entries that were not acknowledged; ``reset``
moves it anywhere, a negative value counting back from the end.  Every
process sees a change at once, and it survives the death of any process.
``Log.group`` opens one; group_admin.py resets and deletes a group across
shards.
"""

from __future__ import annotations

from ._comet import lib
from .errors import raise_for

_ack = lib.comet_group_ack


def check_group_name(name: str) -> None:
    """Raises GroupNameError unless ``name`` is a valid consumer-group name
    (1-47 bytes of ``[A-Za-z0-9._-]``): the C core's own rule, so a tool can
    refuse a bad name before it opens anything."""
    raw = name.encode("utf-8", "surrogateescape")
    rc = lib.comet_validate_group_name(raw, len(raw))
    if rc < 0:
        raise_for(rc)


class Group:
    __slots__ = ("stream", "shard", "name", "_ptr")

    def __init__(self, stream: str, shard: int, name: str, ptr: object) -> None:
        self.stream = stream
        self.shard = shard
        self.name = name
        self._ptr = ptr

    def ack(self, entry: int) -> int:
        """Entries up to ``entry`` are consumed; returns the new offset."""
        rc = _ack(self._ptr, entry)
        if rc < 0:
            raise_for(rc)
        return rc

    def ack_range(self, first: int, last: int) -> int:
        rc = lib.comet_group_ack_range(self._ptr, first, last)
        if rc < 0:
            raise_for(rc)
        return rc

    def reset(self, offset: int) -> int:
        """Moves the offset anywhere (clamped to the log); -3 replays the last 3."""
        rc = lib.comet_group_reset(self._ptr, offset)
        if rc < 0:
            raise_for(rc)
        return rc

    def count(self, delivered: int = 0, retries: int = 0, failed: int = 0) -> None:
        """Adds to the group's delivery counters in this shard (what
        ``comet stat`` and ``/metrics`` show): records delivered, failed
        attempts retried, records given up on."""
        rc = lib.comet_group_count(self._ptr, delivered, retries, failed)
        if rc < 0:
            raise_for(rc)

    @property
    def offset(self) -> int:
        rc = lib.comet_group_offset(self._ptr)
        if rc < 0:
            raise_for(rc)
        return rc

    @property
    def lag(self) -> int:
        rc = lib.comet_group_lag(self._ptr)
        if rc < 0:
            raise_for(rc)
        return rc

    def __repr__(self) -> str:
        return f"Group({self.name!r}, stream={self.stream!r}, shard={self.shard})"
