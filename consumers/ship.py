"""The shipping worker: drains a stream into NDJSON objects compressed with
zstd, in a directory or an S3 bucket, exactly once.

Keys come from the offsets an object covers, below the hive-style
partition every export of the log shares (``comet.export``)::

    <prefix>/stream=<stream>/dt=YYYY-MM-DD/hour=HH/shard=NNNN/<first>-<last>.ndjson.zst

(the date and hour of its first entry, UTC; entry numbers padded to 20
digits so that keys sort in log order).  An object is cut before it would pass
``max_object_bytes``, when its oldest entry waited ``max_object_age``, and at
every hour boundary.  The group's offset is acknowledged only after the sink
stored the object.

Exactly once: size and hour cuts depend only on the entries, so a rerun from
the acknowledged offset cuts at the same places; an age cut depends on time,
so before an object is uploaded its range is written to an intent file
(``intents.py``).  A rerun that finds an intent whose first entry is the
group's offset rebuilds exactly that object (same entries, same bytes, same
key) before doing anything else.  An upload therefore either happened and is acknowledged, or
is repeated to the same key: never a second, overlapping object.

Across power cuts as well: before an object's intent is written, the
object's entries are made durable in the log (an object never stands for
entries a power cut takes back, whose numbers the log would give to new
data) and so is the group's previous ack of that shard (the intent replaces
the previous one, so after a cut the group's offset is at this intent's
first entry or past it, never at an earlier object whose boundaries a rerun
could not know).  Directories (of the sink, of the intents) are made durable
in their parents before a file in them is (``comet.files.make_dirs_durably``).

Lines are the payloads.  A payload that would break the NDJSON framing (it
holds a newline) or would read back as an envelope is written
as the envelope ``{"base64": "..."}`` instead (``comet.export``).

Failures (``errors.classify``): every failed upload is logged
(``upload_failed``) and counted (``ShipStats``, the periodic ``status`` line)
and retried with capped exponential backoff, except that with ``once`` a
permanent failure (no such bucket, access denied, a directory that cannot be
written...) raises ``ShipError`` at once, and that ``max_retries`` failed
retries of one upload raise it too (default: unlimited, ``ONCE_MAX_RETRIES``
with ``once``).  Nothing is acknowledged for an object that was not stored.

Temporary files: a run killed mid-upload leaves the directory sink's
``.<key>.<pid>.tmp`` and, killed while writing an intent, the intent's
temporary file.  ``run`` first removes those of its own shards whose writer
is no longer alive (``remove_temp_files``); a shipper that is running keeps
its files, since shards are never shipped by two processes at once.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, cast

import zstandard

from comet.backoff import backoff_delay
from comet.clikit import iso
from comet.export import HOUR_NS, ndjson_batch_ok, ndjson_line, partition_path
from comet.jsonlog import event
from storage_c import ReadBatch

from .consumer import Consumer
from .errors import ShipError, SinkFailure, classify
from .intents import Intent, IntentJournal
from .loop import sleep_unless, stopper
from .sinks import Sink

log = logging.getLogger("comet.ship")

MiB = 1 << 20
ONCE_MAX_RETRIES = 5
"""Retries of one upload with ``once`` when ``max_retries`` is not set."""


@dataclass(frozen=True)
class ShipConfig:
    max_object_bytes: int = 64 * MiB
    """Uncompressed NDJSON bytes at most per object."""
    max_object_age_s: float = 60.0
    """An object is cut when its first entry has waited this long."""
    compression_level: int = 1
    """zstd level; 1 compresses ~2x faster than 3 here at a similar ratio on JSON logs."""
    batch_size: int = 10_000
    poll_interval_s: float = 0.5
    retry_backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    stop_retries: int = 3
    """Uploads still tried after a stop request before giving up (the intent stays)."""
    max_retries: int | None = None
    """Retries of one upload before the run raises ShipError: None is
    unlimited, or ONCE_MAX_RETRIES with ``once``; 0 gives up at the first failure."""
    status_interval_s: float = 60.0
    """Seconds between ``status`` log lines (0: none)."""


@dataclass
class ShipStats:
    objects: int = 0
    entries: int = 0
    raw_bytes: int = 0
    stored_bytes: int = 0
    upload_errors: int = 0
    """Failed uploads (attempts), permanent and transient."""
    permanent_errors: int = 0
    transient_errors: int = 0
    failing: int = 0
    """Consecutive failures of the upload in progress (0: the last one worked)."""
    last_error: str = ""
    """``<code>: <detail>`` of the last failure."""
    last_shipped_ns: int = 0
    temp_files_removed: int = 0
    """Temporary files of dead writers removed at start."""

    def as_dict(self) -> dict[str, Any]:
        return {"objects": self.objects, "entries": self.entries, "raw_bytes": self.raw_bytes,
                "stored_bytes": self.stored_bytes, "upload_errors": self.upload_errors,
                "permanent_errors": self.permanent_errors,
                "transient_errors": self.transient_errors, "failing": self.failing,
                "last_error": self.last_error or None,
                "last_shipped": iso(self.last_shipped_ns) if self.last_shipped_ns else None,
                "temp_files_removed": self.temp_files_removed}


@dataclass
class Pending:
    """The object being built for one shard.  It is compressed in one call at
    the end so that the frame records its content size (one-shot
    decompressors need it; streaming compression measured no faster here)."""

    first: int
    hour: int  # timestamp // HOUR_NS of the first entry
    started: float  # monotonic time the first entry was taken
    last: int = -1
    size: int = 0  # NDJSON bytes
    count: int = 0
    chunks: list[bytes] = field(default_factory=list)  # NDJSON pieces, each ending in a newline

    def add(self, ndjson: bytes, entries: int, last: int) -> None:
        self.chunks.append(ndjson)
        self.size += len(ndjson)
        self.count += entries
        self.last = last


def object_key(stream: str, shard: int, hour: int, first: int, last: int) -> str:
    """The key of the object of entries ``first``..``last`` of ``shard``,
    whose first entry falls in ``hour`` (hours since the epoch, UTC)."""
    return (f"{partition_path(stream, hour * HOUR_NS)}/shard={shard:04d}/"
            f"{first:020d}-{last:020d}.ndjson.zst")


class Shipper:
    def __init__(self, consumer: Consumer, sink: Sink, config: ShipConfig | None = None,
                 state_dir: str | os.PathLike[str] | None = None) -> None:
        self.consumer = consumer
        self.sink = sink
        self.config = config or ShipConfig()
        root = Path(state_dir) if state_dir else Path(consumer.log.path) / ".ship"
        self.intents = IntentJournal(root, consumer.group, consumer.stream)
        self.pending: dict[int, Pending] = {}
        self._unsynced_acks: set[int] = set()
        """Shards whose last ack may not be durable yet (see ``make_durable``)."""
        self.stats = ShipStats()
        self._once = False
        self._last_status = time.monotonic()
        self._compressor = zstandard.ZstdCompressor(level=self.config.compression_level,
                                                    write_content_size=True)

    def _open(self, shard: int, first: int, hour: int) -> Pending:
        p = self.pending[shard] = Pending(first, hour, time.monotonic())
        return p

    # ---- the loop ----------------------------------------------------------------------

    def run(self, stop: Callable[[], bool] | object | None = None, *, once: bool = False) -> ShipStats:
        """Ships until stopped (or, with ``once``, until nothing is left), then
        finishes the objects in progress."""
        stopped = stopper(stop)
        self._once = once
        self._last_status = time.monotonic()
        self.remove_temp_files()
        self.intents.check_incarnation(self.consumer.log.stream_created_ns(self.consumer.stream))
        if not self.resume(stopped):
            return self.stats
        while not stopped():
            moved = False
            for shard in self.consumer.shards():
                moved |= self.pump(shard, stopped)
            if once and not moved:
                break
            self.cut_aged(stopped)
            self.report_status()
            if not moved:
                sleep_unless(stopped, self.config.poll_interval_s)
        # A run that ends because it was stopped tries each open object a few
        # more times (stop_retries); a --once run that ends because nothing is
        # left finishes them under the usual rules (max_retries, then ShipError).
        finish = stopped if once and not stopped() else (lambda: True)
        for shard in list(self.pending):
            self.flush(shard, finish)
        return self.stats

    def pump(self, shard: int, stopped: Callable[[], bool]) -> bool:
        """Reads the next entries of a shard into its pending object."""
        p = self.pending.get(shard)
        start = p.last + 1 if p else self.consumer.offset(shard)
        log, stream = self.consumer.log, self.consumer.stream
        limit = self.config.max_object_bytes
        nd = log.read_ndjson(stream, shard, start, self.config.batch_size,
                             max_bytes=min(limit, 16 * MiB))
        entries, stamps = nd.entries, nd.timestamps
        data = cast(bytes, nd.data)  # bytes: read_ndjson was given no into= buffer
        if not len(entries):
            if nd.skipped and p is None:  # deleted or damaged entries: move past them
                self.consumer.ack(shard, nd.next_entry - 1)
                self._unsynced_acks.add(shard)
            return bool(nd.skipped)
        hour = stamps[0] // HOUR_NS
        simple = (nd.newline_payloads == 0 and stamps[-1] // HOUR_NS == hour
                  and len(data) <= limit and ndjson_batch_ok(data))
        if simple and p is not None and p.hour != hour:
            if not self.flush(shard, stopped):
                return False
            p = None
        if simple and (p is None or p.size + len(data) <= limit):
            # The common case: the batch, already NDJSON, joins the object whole.
            if p is None:
                p = self._open(shard, entries[0], hour)
            p.add(data, len(entries), entries[-1])
            return p.size < limit or self.flush(shard, stopped)
        return self.take(shard, log.read(stream, shard, start, len(entries), 64 * MiB), stopped)

    def take(self, shard: int, batch: ReadBatch, stopped: Callable[[], bool]) -> bool:
        """Adds entries one by one, cutting at hour boundaries and before the
        size limit; False when a cut could not be uploaded."""
        limit = self.config.max_object_bytes
        stamps, entries = batch.timestamps, batch.entries
        p = self.pending.get(shard)
        for i, payload in enumerate(batch.payloads):
            line = ndjson_line(payload)
            hour = stamps[i] // HOUR_NS
            if p is not None and (hour != p.hour or (p.count and p.size + len(line) > limit)):
                if not self.flush(shard, stopped):
                    return False
                p = None
            if p is None:
                p = self._open(shard, entries[i], hour)
            p.add(line, 1, entries[i])
        if p is not None and p.size >= limit:
            return self.flush(shard, stopped)
        return True

    def cut_aged(self, stopped: Callable[[], bool]) -> None:
        now = time.monotonic()
        for shard, p in list(self.pending.items()):
            if now - p.started >= self.config.max_object_age_s:
                self.flush(shard, stopped)

    # ---- one object ----------------------------------------------------------------

    def flush(self, shard: int, stopped: Callable[[], bool], key: str | None = None) -> bool:
        """Uploads the shard's object, then acknowledges it."""
        p = self.pending.get(shard)
        if p is None or not p.count:
            self.pending.pop(shard, None)
            return True
        if key is None:
            key = object_key(self.consumer.stream, shard, p.hour, p.first, p.last)
            self.make_durable(shard, p.last)
            self.intents.write(shard, Intent(p.first, p.last, key))
        data = self._compressor.compress(b"".join(p.chunks))
        if not self.upload(key, data, p.size, stopped):
            return False  # the intent stays: the next run uploads exactly this object
        self.consumer.ack(shard, p.last)
        self._unsynced_acks.add(shard)
        self.stats.objects += 1
        self.stats.entries += p.count
        self.stats.last_shipped_ns = time.time_ns()
        del self.pending[shard]
        return True

    @property
    def max_retries(self) -> int | None:
        if self.config.max_retries is not None:
            return self.config.max_retries
        return ONCE_MAX_RETRIES if self._once else None

    def upload(self, key: str, data: bytes, raw_size: int, stopped: Callable[[], bool]) -> bool:
        """Puts the object, retrying with backoff; after a stop request only
        ``stop_retries`` more times, and a permanent failure not at all (False:
        not stored, the intent stays).
        Raises ShipError on a permanent failure with ``once``, and when
        ``max_retries`` retries failed; nothing is acknowledged then either."""
        retry = 0
        while True:
            try:
                self.sink.put(key, data)
            except Exception as exc:  # classified: permanent or transient
                failure = self.count_failure(exc)
                limit = self.max_retries
                if failure.permanent and self._once:
                    raise ShipError(self.sink.describe(), failure, attempts=retry + 1,
                                    max_retries=None, key=key) from exc
                if limit is not None and retry >= limit:
                    raise ShipError(self.sink.describe(), failure, attempts=retry + 1,
                                    max_retries=limit, key=key) from exc
                event(log, "upload_failed", logging.WARNING, key=key,
                      sink=self.sink.describe(), retry=retry, permanent=failure.permanent,
                      code=failure.code, error=failure.detail, hint=failure.hint)
                if stopped() and (failure.permanent or retry >= self.config.stop_retries):
                    return False
                delay = backoff_delay(retry, self.config.retry_backoff_s, self.config.max_backoff_s)
                if stopped():
                    time.sleep(min(delay, 1.0))
                else:
                    self.wait(stopped, delay)
                retry += 1
                continue
            self.stats.failing = 0
            self.stats.raw_bytes += raw_size
            self.stats.stored_bytes += len(data)
            event(log, "shipped", key=key, raw_bytes=raw_size, stored_bytes=len(data))
            return True

    def count_failure(self, exc: BaseException) -> SinkFailure:
        failure = classify(exc, self.sink)
        self.stats.upload_errors += 1
        if failure.permanent:
            self.stats.permanent_errors += 1
        else:
            self.stats.transient_errors += 1
        self.stats.failing += 1
        self.stats.last_error = f"{failure.code}: {failure.detail}"
        return failure

    def wait(self, stopped: Callable[[], bool], seconds: float) -> None:
        """Sleeps unless stopped, still writing the status line on time."""
        deadline = time.monotonic() + seconds
        while not stopped():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            sleep_unless(stopped, min(left, 1.0))
            self.report_status()

    # ---- what an operator sees ---------------------------------------------------------

    def report_status(self, force: bool = False) -> None:
        """Every ``status_interval_s``: one ``status`` line with the counters."""
        interval = self.config.status_interval_s
        now = time.monotonic()
        if not force and (interval <= 0 or now - self._last_status < interval):
            return
        self._last_status = now
        lag: int | None
        try:
            lag = self.consumer.lag()
        except Exception:  # the counters matter more than the lag
            lag = None
        event(log, "status", stream=self.consumer.stream, group=self.consumer.group,
              sink=self.sink.describe(), **self.stats.as_dict(), lag=lag)

    # ---- temporary files of killed runs ------------------------------------------------

    def remove_temp_files(self) -> int:
        """Removes, for each shard of this shipper, the temporary files of
        writers that are no longer alive: the intent's (in the state
        directory) and the object's the intent names (directory sinks).  Files
        named after this process are stale too: nothing was written yet, and
        a shard is never shipped by two shippers at once.  Returns how many."""
        removed: list[Path] = []
        clean_sink = getattr(self.sink, "remove_temp_files", None)
        for shard in self.consumer.shards():
            removed += self.intents.remove_stale_temp_files(shard)
            if clean_sink is None:
                continue
            try:
                intent = self.intents.read(shard)
            except ValueError:
                continue  # resume() reports it
            if intent is not None:
                removed += clean_sink(intent.key, mine_are_stale=True)
        for p in removed:
            event(log, "temp_file_removed", path=p)
        self.stats.temp_files_removed += len(removed)
        return len(removed)

    # ---- intents: exactly once across crashes -----------------------------------------

    def make_durable(self, shard: int, last: int) -> None:
        """Before the intent of an object ending at ``last``: the object's
        entries are durable in the log, and so is the group's last ack of
        ``shard`` (see the module docstring).  The writers' flushers have
        usually synced both already (an object waits up to max_object_age)."""
        log, stream = self.consumer.log, self.consumer.stream
        if log.shard_stats(stream, shard).durable_entry <= last:
            log.sync(stream, shard)
        if shard in self._unsynced_acks:
            log.sync()  # the offsets files (the storage has no call for one shard's)
            self._unsynced_acks.clear()

    def resume(self, stopped: Callable[[], bool]) -> bool:
        """Finishes the object each shard's last run had decided on; False
        when one could not be uploaded before a stop request."""
        for shard in self.consumer.shards():
            intent = self.intents.read(shard)
            if intent is None:
                continue
            first, last = intent.first, intent.last
            if first != self.consumer.offset(shard):
                self.intents.drop(shard)  # acknowledged already, or the offset was reset
                continue
            p = self._open(shard, first, 0)
            at = first
            while at <= last:
                batch = self.consumer.log.read(self.consumer.stream, shard, at,
                                               min(self.config.batch_size, last - at + 1))
                for entry, payload in zip(batch.entries, batch.payloads):
                    if entry <= last:
                        p.add(ndjson_line(payload), 1, entry)
                if batch.next_entry == at:
                    break  # the log ends before the intent's range: it was cut by recovery
                at = batch.next_entry
            p.last = last
            if not self.flush(shard, stopped, key=intent.key):
                return False
        return True
