"""Consumer: a consumer group's view of one stream.

A group keeps one offset per shard in the storage core (shared by every
process, kept across crashes).  ``read`` always starts at the group's offset,
so what was read but not acknowledged is read again: delivery is
at-least-once, and exactly-once into a sink comes from outputs named after the
offsets they cover (see ``ship.py``).

Several consumer processes of one group split the shards with
``assignment=(i, n)``: process i takes the shards with ``shard % n == i``.
"""

from __future__ import annotations

import logging
import os
from typing import Callable, Iterable, Sequence

from comet.jsonlog import event
from storage_c import AckGapError, Config, Group, Log, ReadBatch, StreamNotFound, check_group_name

from .loop import ProcessStats, process_batches

log = logging.getLogger("comet.consumer")

DEFAULT_BATCH = 1000


class Consumer:
    """Reads ``stream`` as consumer group ``group``.

    >>> with Consumer("./data", "events", "indexer") as c:
    ...     batch = c.read()
    ...     handle(batch)
    ...     c.ack(batch.shard, batch.entries[-1])
    """

    def __init__(self, data_dir: str | os.PathLike[str] | Log, stream: str, group: str, *,
                 config: Config | None = None, shards: Iterable[int] | None = None,
                 assignment: tuple[int, int] | None = None) -> None:
        check_group_name(group)
        if assignment is not None:
            i, n = assignment
            if not 0 <= i < n:
                raise ValueError(f"assignment {assignment!r}: need 0 <= i < n")
        self._owns_log = not isinstance(data_dir, Log)
        # A path is opened as a reader (Config.reader): no retention of its
        # own, and the flusher on so that acks are fsynced within
        # fsync_interval_ms.  A Log passed in is used as its owner opened it.
        self.log: Log = (data_dir if isinstance(data_dir, Log)
                         else Log(data_dir, config or Config.reader()))
        self.stream = stream
        self.group = group
        self._only = None if shards is None else sorted(set(shards))
        self._assignment = assignment
        self._groups: dict[int, Group] = {}
        self._read_from: dict[int, int] = {}  # shard -> offset its last read started at
        self._turn = 0

    # ---- shards ---------------------------------------------------------------------

    def shards(self) -> list[int]:
        """Shards this consumer reads: [] until the stream exists, then its
        assigned ones.  Registering the group in all of them at once is what
        lets retention protect the group's unread data in every shard."""
        try:
            count = self.log.shard_count(self.stream)
        except StreamNotFound:
            return []
        picked = [s for s in range(count) if self._only is None or s in self._only]
        if self._assignment is not None:
            i, n = self._assignment
            picked = [s for s in picked if s % n == i]
        for shard in picked:
            self._group(shard)
        return picked

    def _group(self, shard: int) -> Group:
        g = self._groups.get(shard)
        if g is None:
            g = self._groups[shard] = self.log.group(self.stream, shard, self.group)
        return g

    # ---- reading and acknowledging -----------------------------------------------

    def read(self, max_entries: int = DEFAULT_BATCH, *, shard: int | None = None,
             max_bytes: int = 4 << 20) -> ReadBatch:
        """Entries of one shard from the group's offset (the next shard with
        anything unread, in turn, unless ``shard`` is given).  An empty batch
        when nothing is pending."""
        candidates = [shard] if shard is not None else self.shards()
        if not candidates:
            return ReadBatch.empty(self.stream, -1)
        for k in range(len(candidates)):
            s = candidates[(self._turn + k) % len(candidates)]
            group = self._group(s)
            start = group.offset
            batch = self.log.read(self.stream, s, start, max_entries, max_bytes)
            self._read_from[s] = start
            if len(batch) or batch.skipped:
                self._turn = (self._turn + k + 1) % len(candidates)
                return batch
        return batch

    def ack(self, shard: int, entry: int) -> int:
        """Entries of ``shard`` up to ``entry`` are done; returns the new offset."""
        return self._group(shard).ack(entry)

    def ack_batch(self, batch: ReadBatch) -> int:
        """Acknowledges everything a read returned, skipped entries included.

        The range starts where the read started: if the group was reset
        backwards meanwhile (``comet group reset``), acknowledging it would
        skip the entries the reset asked to see again, so it is dropped and
        the next read starts at the reset point."""
        group = self._group(batch.shard)
        start = self._read_from.get(batch.shard)
        if start is None or batch.next_entry <= start:
            return group.ack(batch.next_entry - 1) if batch.next_entry else group.offset
        try:
            return group.ack_range(start, batch.next_entry - 1)
        except AckGapError:
            event(log, "ack_dropped_after_reset", stream=self.stream, group=self.group,
                  shard=batch.shard, offset=group.offset)
            return group.offset

    def count_delivery(self, shard: int, *, delivered: int = 0, retries: int = 0,
                       failed: int = 0) -> None:
        """Adds to the group's delivery counters of ``shard`` (``Group.count``)."""
        self._group(shard).count(delivered, retries, failed)

    def ack_range(self, shard: int, first: int, last: int) -> int:
        return self._group(shard).ack_range(first, last)

    def reset_offset(self, shard: int, offset: int) -> int:
        """Moves the group's offset in ``shard``; negative counts back from the end."""
        return self._group(shard).reset(offset)

    def offset(self, shard: int) -> int:
        return self._group(shard).offset

    def lag(self, shard: int | None = None) -> int:
        """Entries committed but not yet acknowledged (one shard, or all assigned)."""
        if shard is not None:
            return self._group(shard).lag
        return sum(self._group(s).lag for s in self.shards())

    # ---- the processing loop -----------------------------------------------------

    def process(self, handler: Callable[[ReadBatch], object], *, batch_size: int = DEFAULT_BATCH,
                poll_interval: float = 0.1, max_retries: int = 3, retry_backoff: float = 0.1,
                max_backoff: float = 30.0, on_error: Callable[[BaseException, ReadBatch, int], object] | None = None,
                on_batch: Callable[[ReadBatch], object] | None = None, auto_ack: bool = True,
                dead_letter: bool = True, shards: Sequence[int] | None = None,
                assignment: tuple[int, int] | None = None,
                stop: Callable[[], bool] | object | None = None) -> ProcessStats:
        """Calls ``handler(batch)`` for every batch until ``stop`` (an Event or a
        callable) says so.  A failing handler is retried ``max_retries`` times
        with exponential backoff and jitter (``on_error(exc, batch, retry)``
        sees each failure); then the batch goes to ``<stream>.dlq`` and the
        offset moves on, or, with ``dead_letter=False``, ProcessingError is
        raised.  Shards that appear later are picked up."""
        if shards is not None or assignment is not None:
            self._only = None if shards is None else sorted(set(shards))
            self._assignment = assignment if assignment is not None else self._assignment
        return process_batches(self, handler, batch_size=batch_size, poll_interval=poll_interval,
                               max_retries=max_retries, retry_backoff=retry_backoff,
                               max_backoff=max_backoff, on_error=on_error, on_batch=on_batch,
                               auto_ack=auto_ack, dead_letter=dead_letter, stop=stop)

    # ---- lifecycle -------------------------------------------------------------------

    def close(self) -> None:
        self._groups.clear()
        if self._owns_log:
            self.log.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

