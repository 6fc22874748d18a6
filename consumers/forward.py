"""The OTLP forwarder of ``comet ship``: drains a stream into an OTLP/HTTP
backend through outages, restarts and power cuts, exactly once where the
backend honours ``Idempotency-Key``.

The log is the queue.  Nothing is held in memory that the log does not
hold: a batch is a range of entries of one shard, read when it is sent and
read again after a crash; the group's offset moves past it only after a 2xx
(or after its records went to dead letters).  An outage of days costs disk,
which retention protects for the group (``protect_unconsumed``), not data.

Batches.  From a shard's position, a batch is the entries a read gives with
``max_batch_records`` and ``max_batch_bytes`` (stored bytes): a *full*
batch, which depends only on the entries, so that a rerun from the group's
offset cuts the same batches.  At the end of what is there, a *partial*
batch is sent once its first entry has waited ``max_batch_age_s``; it
depends on timing, so its range is first recorded durably in the shard's
batch intents (``intents.py``), and a rerun that reaches its first entry
rebuilds exactly it.  Every request carries the key
``<stream>/<shard>/<first>-<last>/<incarnation>``: a batch rebuilt after a
crash is the same records (and the same bytes: the encoder is
deterministic), so a backend that keeps keys (``comet serve`` does) stores
it once, and one that does not gets at most the batches in flight twice.

Only durable entries are sent (``read(durable_only=True)``): a batch must
never hold entries a power cut could take back, whose numbers the log would
give to other records under the same key.  A tail that stays committed but
not durable for ``max_batch_age_s`` is synced by the forwarder.

Concurrency.  Up to ``concurrency`` requests are in flight, from any shards
(several per shard).  The main thread reads each batch into one reused
buffer and encodes it there (storage_c's encoder, in C, without the GIL):
a batch keeps only its request, and the rare paths that need its entries
(dead letters) read them again.  A thread per request compresses and posts.
The main thread acknowledges each shard's batches in order: the offset
moves past a batch only when it and every batch before it are done.

Answers (``otlp_sink.Outcome``): a 2xx is delivered (``partial_success``
counted and logged, not retried); connection errors, timeouts, 429, 5xx
but 501 and 505, and redirects are retried after ``Retry-After`` or a
backoff with jitter, without limit by default (``max_retries``); any other
status is permanent for the batch: its records go to ``<stream>.dlq`` with
the status and the answer, and shipping goes on.  Events that are not in
the layout of the signal go there too, and are not sent.  A stream named
``<stream>.dlq`` is replayed: the events its dead letters hold.

Stopping: no new batch is cut; requests in flight get ``stop_retries`` more
attempts; what was not delivered stays in the log for the next run.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from array import array
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import orjson

from comet.backoff import next_wait_s
from comet.clikit import iso
from comet.export import payload_of
from comet.jsonlog import event
from storage_c import AckGapError, ReadBatch, otlp
from storage_c.testing import cut_point

from .consumer import Consumer
from .errors import ShipError, SinkFailure
from .intents import Intent, IntentJournal
from .loop import sleep_unless, stopper, store_dead_letters
from .otlp_sink import OtlpHttpSink, Outcome
from .ship import ONCE_MAX_RETRIES, MiB

log = logging.getLogger("comet.ship")

INTENT_READ_BYTES = 1 << 30
"""A recorded batch is read back whole, whatever max_batch_bytes is now."""


@dataclass(frozen=True)
class ForwardConfig:
    max_batch_records: int = 1000
    max_batch_bytes: int = 4 * MiB
    """Stored bytes (the events' JSON) at most per batch; one larger event is a batch alone."""
    max_batch_age_s: float = 1.0
    """A partial batch is sent when its first entry has waited this long."""
    concurrency: int = 4
    poll_interval_s: float = 0.2
    retry_backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    max_retries: int | None = None
    """Retries of one request before the run raises ShipError: None is
    unlimited, or ONCE_MAX_RETRIES with ``once``."""
    stop_retries: int = 0
    """Retries a request in flight still gets after a stop request (its
    records stay in the log for the next run either way)."""
    status_interval_s: float = 60.0


@dataclass
class ForwardStats:
    requests: int = 0
    """Requests the backend accepted (2xx)."""
    records: int = 0
    """Records in them (partial_success refusals included)."""
    sent_bytes: int = 0
    retries: int = 0
    """Failed attempts that were retried."""
    permanent_failures: int = 0
    """Requests refused for good: their records went to dead letters."""
    dead_lettered: int = 0
    """Records put in ``<stream>.dlq`` (refused requests, events not in the layout)."""
    rejected: int = 0
    """Records a 2xx's partial_success refused."""
    failing: int = 0
    """Consecutive failed attempts (0: the last one worked)."""
    last_error: str = ""
    last_success_ns: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "records": self.records, "sent_bytes": self.sent_bytes,
                "retries": self.retries, "permanent_failures": self.permanent_failures,
                "dead_lettered": self.dead_lettered, "rejected": self.rejected,
                "failing": self.failing, "last_error": self.last_error or None,
                "last_success": iso(self.last_success_ns) if self.last_success_ns else None}


DELIVERED, DEAD_LETTERED, SKIPPED, ABANDONED = "delivered", "dead-lettered", "skipped", "abandoned"
DLQ_SUFFIX = ".dlq"


def unwrap_dead_letters(read: ReadBatch) -> tuple[bytes, array, array, list[int], dict[int, str]]:
    """A batch of dead letters (``loop.store_dead_letters``) as the events
    they hold with their original times, and for each the index of its dead
    letter; the entries that are not dead letters, by index, with why."""
    parts: list[bytes] = []
    offsets, stamps = array("i", [0]), array("q")
    where: list[int] = []
    wrong: dict[int, str] = {}
    for i, payload in enumerate(read.payloads):
        try:
            letter = orjson.loads(payload)
            event_bytes, stamp = payload_of(letter["payload"]), int(letter["timestamp"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            wrong[i] = f"not a dead letter ({type(exc).__name__}: {exc})"
            continue
        parts.append(event_bytes)
        offsets.append(offsets[-1] + len(event_bytes))
        stamps.append(stamp)
        where.append(i)
    return b"".join(parts), offsets, stamps, where, wrong


@dataclass
class Batch:
    shard: int
    first: int
    last: int
    """The entries the batch stands for, ``ack_to`` included."""
    ack_to: int
    key: str
    entries: array | None
    """The entries read (None: nothing to send: entries retention deleted or
    damaged, acknowledged in turn)."""
    request: bytes = b""
    """The export request of the entries (protobuf)."""
    count: int = 0
    """Records in ``request``."""
    rejected: dict[int, str] = field(default_factory=dict)
    """Entries (by index) not in the layout of the signal: not in ``request``."""
    outcome: str | None = None
    error: BaseException | None = None


@dataclass
class ShardState:
    position: int
    """Where the next batch starts."""
    batches: collections.deque[Batch] = field(default_factory=collections.deque)
    intents: list[Intent] = field(default_factory=list)
    """Batches cut by age that may not be acknowledged durably yet."""
    stalled_since: float = 0.0
    """Monotonic time since nothing durable was left to read while more was committed."""


class Forwarder:
    """Forwards one stream, as one consumer group, to one OTLP/HTTP endpoint."""

    def __init__(self, consumer: Consumer, sink: OtlpHttpSink, signal: str, *,
                 plain_resource: bytes | None = None, config: ForwardConfig | None = None,
                 state_dir: str | os.PathLike[str] | None = None) -> None:
        """A stream named ``<stream>.dlq`` holds dead letters: each record's
        original event (``payload``) is sent, with its original time."""
        self.consumer = consumer
        self.sink = sink
        self.signal = signal
        self.plain_resource = plain_resource
        self.dead_letters = consumer.stream.endswith(DLQ_SUFFIX)
        self.config = config or ForwardConfig()
        root = Path(state_dir) if state_dir else Path(consumer.log.path) / ".ship"
        self.intents = IntentJournal(root, consumer.group, consumer.stream)
        self.stats = ForwardStats()
        self.state: dict[int, ShardState] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._halt = threading.Event()
        """Set when the run gives up (a ShipError): requests in flight stop retrying."""
        self._locks: list[int] = []
        self._once = False
        self._incarnation = 0
        self._last_status = time.monotonic()
        self._last_offsets_sync = 0.0
        self._synced_offsets: dict[int, int] = {}
        self._failing_logged = 0.0
        self._buffer = bytearray(self.config.max_batch_bytes)
        """Where batches are read (the bytes limit cuts them before it is full)."""

    # ---- the loop ----------------------------------------------------------------------

    def run(self, stop: Callable[[], bool] | object | None = None, *, once: bool = False) -> ForwardStats:
        """Forwards until stopped (or, with ``once``, until nothing is left)."""
        asked = stopper(stop)
        self._halt.clear()

        def stopped() -> bool:
            return self._halt.is_set() or asked()

        self._once = once
        try:
            self._take_shards()
            with ThreadPoolExecutor(max_workers=self.config.concurrency,
                                    thread_name_prefix="comet-ship") as pool:
                try:
                    self._loop(pool, stopped)
                except BaseException:
                    self._halt.set()
                    raise
            self._collect()
        finally:
            for fd in self._locks:
                os.close(fd)
            self._locks.clear()
            self.report_status(force=True)
        return self.stats

    def _take_shards(self) -> None:
        """Claims the shards the group has in this process and not yet taken
        (none until the stream exists: it may be created after the start)."""
        new = [s for s in self.consumer.shards() if s not in self.state]
        if not new:
            return
        for shard in new:
            self._locks.append(self.intents.claim(shard))
        if not self.state:
            self._incarnation = self.consumer.log.stream_created_ns(self.consumer.stream)
            if self.intents.check_incarnation(self._incarnation, replace=True):
                for shard in new:  # the records of the stream's former life
                    self.intents.write_batches(shard, [])
        for shard in new:
            self.intents.remove_stale_batch_temp_files(shard)
            offset = self.consumer.offset(shard)
            kept = [i for i in self.intents.read_batches(shard) if i.first >= offset]
            self.state[shard] = ShardState(offset, intents=kept)
            self._synced_offsets[shard] = offset

    def _loop(self, pool: ThreadPoolExecutor, stopped: Callable[[], bool]) -> None:
        room = 2 * self.config.concurrency
        turn = 0
        while not stopped():
            if not self.state:
                self._take_shards()
            cut = 0
            shards = list(self.state)
            for k in range(len(shards)):
                shard = shards[(turn + k) % len(shards)]
                while self._in_flight() < room:
                    batch = self._cut(shard)
                    if batch is None:
                        break
                    self.state[shard].batches.append(batch)
                    cut += 1
                    if batch.entries is None:
                        batch.outcome = SKIPPED
                    else:
                        pool.submit(self._deliver, batch, stopped).add_done_callback(self._done)
            turn += 1
            acked = self._collect()
            self.report_status()
            if self._once and not cut and not self._in_flight():
                break
            if not cut and not acked:
                self._wake.wait(self.config.poll_interval_s)
                self._wake.clear()
        # Stopped: requests in flight finish (a few attempts at most), nothing new is cut.
        while self._in_flight():
            self._wake.wait(0.1)
            self._wake.clear()
            self._collect()

    def _done(self, future: Future[None]) -> None:
        self._wake.set()

    def _in_flight(self) -> int:
        return sum(1 for st in self.state.values() for b in st.batches if b.outcome is None)

    # ---- cutting batches ----------------------------------------------------------------

    def key(self, shard: int, first: int, last: int) -> str:
        return f"{self.consumer.stream}/{shard}/{first}-{last}/{self._incarnation}"

    def _cut(self, shard: int) -> Batch | None:
        st = self.state[shard]
        log, stream, cfg = self.consumer.log, self.consumer.stream, self.config
        p = st.position
        nxt = next((i for i in st.intents if i.last >= p), None)
        if nxt is not None and nxt.first <= p:
            # A batch recorded before a crash: exactly its entries again.
            read = log.read(stream, shard, p, nxt.last - p + 1, INTENT_READ_BYTES)
            return self._batch(shard, read, nxt.last, recorded=nxt)
        limit = cfg.max_batch_records if nxt is None else min(cfg.max_batch_records, nxt.first - p)
        # into the read buffer: _batch encodes from it before the next read
        read = log.read(stream, shard, p, limit, cfg.max_batch_bytes, durable_only=True,
                        into=self._buffer)
        if not len(read) and not read.skipped and self._sync_if_stalled(shard, st):
            read = log.read(stream, shard, p, limit, cfg.max_batch_bytes, durable_only=True,
                            into=self._buffer)
        if not len(read):
            if read.skipped:
                return self._batch(shard, read, read.next_entry - 1)
            return None
        st.stalled_since = 0.0
        full = len(read) == limit or read.next_entry < read.limit_entry
        if full:
            return self._batch(shard, read, read.next_entry - 1)
        waited_s = (time.time_ns() - read.timestamps[0]) / 1e9
        if not self._once and waited_s < cfg.max_batch_age_s:
            return None
        # Cut by age: recorded first, so that a rerun sends this very batch again.
        last = read.next_entry - 1
        intent = Intent(p, last, self.key(shard, read.entries[0], read.entries[-1]))
        self._record(shard, st, intent)
        return self._batch(shard, read, last, recorded=intent)

    def _batch(self, shard: int, read: ReadBatch, ack_to: int,
               recorded: Intent | None = None) -> Batch:
        """The batch of ``read``, encoded here: ``read`` may be a view of the
        read buffer, which the next read overwrites."""
        st = self.state[shard]
        first = st.position
        st.position = ack_to + 1
        if not len(read):
            return Batch(shard, first, ack_to, ack_to, "", None)
        key = self.key(shard, read.entries[0], read.entries[-1])
        if recorded is not None and recorded.first == read.entries[0] and recorded.last == read.entries[-1]:
            key = recorded.key
        if self.dead_letters:
            data, offsets, stamps, where, wrong = unwrap_dead_letters(read)
            encoded = otlp.encode(self.signal, data, offsets, stamps, plain_resource=self.plain_resource)
            rejected = {where[j]: why for j, why in encoded.rejected.items()}
            rejected.update(wrong)
        else:
            encoded = otlp.encode(self.signal, read.data, read.offsets, read.timestamps,
                                  plain_resource=self.plain_resource)
            rejected = encoded.rejected
        return Batch(shard, first, ack_to, ack_to, key, array("q", read.entries), encoded.request,
                     encoded.count, rejected)

    def _record(self, shard: int, st: ShardState, intent: Intent) -> None:
        """Adds a batch cut by age to the shard's durable record, dropping the
        recorded batches whose acknowledgement is durable."""
        offset = self.consumer.offset(shard)
        if any(i.last < offset for i in st.intents):
            self._sync_offsets()
        durable = self._synced_offsets.get(shard, 0)
        st.intents = [i for i in st.intents if i.last >= durable] + [intent]
        self.intents.write_batches(shard, st.intents)
        cut_point("ship.recorded")

    def _sync_offsets(self) -> None:
        """Makes the group's acknowledgements durable (at most once a second)."""
        now = time.monotonic()
        if now - self._last_offsets_sync < 1.0:
            return
        self.consumer.log.sync()  # the offsets files: the storage has no call for one shard's
        self._last_offsets_sync = now
        for shard in self.state:
            self._synced_offsets[shard] = self.consumer.offset(shard)

    def _sync_if_stalled(self, shard: int, st: ShardState) -> bool:
        """Syncs the shard when committed entries have not become durable for
        max_batch_age_s (the writers' flusher usually does it sooner), or at
        once with ``once``; True when it did."""
        log, stream = self.consumer.log, self.consumer.stream
        stats = log.shard_stats(stream, shard, oldest=False)
        if stats.next_entry <= st.position or stats.durable_entry > st.position:
            st.stalled_since = 0.0
            return False
        now = time.monotonic()
        if not st.stalled_since:
            st.stalled_since = now
        if self._once or now - st.stalled_since >= self.config.max_batch_age_s:
            log.sync(stream, shard)
            st.stalled_since = 0.0
            return True
        return False

    # ---- acknowledging in order ---------------------------------------------------------

    def _collect(self) -> int:
        """Acknowledges each shard's finished batches in order; raises what a
        delivery raised (ShipError: max_retries)."""
        acked = 0
        for shard, st in self.state.items():
            first = last = -1
            while st.batches and st.batches[0].outcome is not None:
                batch = st.batches[0]
                if batch.error is not None:
                    raise batch.error
                if batch.outcome == ABANDONED:
                    break
                st.batches.popleft()
                first = batch.first if first < 0 else first
                last = batch.ack_to
            if last >= 0:
                try:
                    self.consumer.ack_range(shard, first, last)
                except AckGapError:
                    self._reset_seen(shard, st)
                    continue
                cut_point("ship.acked")
                acked += 1
            if any(b.outcome == ABANDONED for b in st.batches) and not self._in_flight_in(st):
                # the rest is read again by the next run, from the offset
                st.batches.clear()
        return acked

    def _reset_seen(self, shard: int, st: ShardState) -> None:
        """The group's offset went back (``comet group reset``) under this run:
        what is in flight is not acknowledged, and cutting starts over there."""
        offset = self.consumer.offset(shard)
        event(log, "offset_reset_seen", stream=self.consumer.stream, group=self.consumer.group,
              shard=shard, offset=offset)
        st.batches.clear()
        st.position = offset
        st.intents = [i for i in st.intents if i.first >= offset]

    @staticmethod
    def _in_flight_in(st: ShardState) -> bool:
        return any(b.outcome is None for b in st.batches)

    # ---- one request --------------------------------------------------------------------

    def _deliver(self, batch: Batch, stopped: Callable[[], bool]) -> None:
        try:
            batch.outcome = self._send(batch, stopped)
        except BaseException as exc:  # handed to the main thread, which raises it
            batch.error = exc
            batch.outcome = ABANDONED

    def _send(self, batch: Batch, stopped: Callable[[], bool]) -> str:
        if batch.rejected:
            why = {i: {"error": f"not an OTLP {self.signal} event: {reason}"}
                   for i, reason in batch.rejected.items()}
            self._dead_letter(batch, why)
            event(log, "events_not_in_layout", logging.WARNING, stream=self.consumer.stream,
                  shard=batch.shard, count=len(why), first_reason=next(iter(batch.rejected.values())),
                  dlq=f"{self.consumer.stream}.dlq")
        if not batch.count:
            return DELIVERED
        body = self.sink.body(batch.request)
        retry = 0
        while True:
            outcome = self.sink.send(body, batch.key)
            if outcome.delivered:
                cut_point("ship.delivered")
                self._delivered(batch, len(body), outcome)
                return DELIVERED
            if outcome.permanent:
                self._refused(batch, outcome)
                return DEAD_LETTERED
            limit = self.config.max_retries
            if limit is None and self._once:
                limit = ONCE_MAX_RETRIES
            self._failed(batch, outcome, retry)
            if limit is not None and retry >= limit:
                failure = SinkFailure(False, f"HTTP {outcome.status}" if outcome.status else "no answer",
                                      outcome.describe(), "check that the endpoint is up and reachable")
                raise ShipError(self.sink.describe(), failure, attempts=retry + 1,
                                max_retries=limit, key=batch.key, action="deliver to")
            if self._halt.is_set() or (stopped() and retry >= self.config.stop_retries):
                return ABANDONED
            delay = next_wait_s(retry, self.config.retry_backoff_s, self.config.max_backoff_s,
                                outcome.retry_after_s)
            if stopped():
                time.sleep(min(delay, 1.0))
            else:
                sleep_unless(stopped, delay)
            retry += 1

    def _delivered(self, batch: Batch, size: int, outcome: Outcome) -> None:
        count = batch.count
        event(log, "delivered", logging.DEBUG, stream=self.consumer.stream, shard=batch.shard,
              key=batch.key, records=count)
        with self._lock:
            s = self.stats
            recovered = s.failing
            s.requests += 1
            s.records += count
            s.sent_bytes += size
            s.failing = 0
            s.last_success_ns = time.time_ns()
            s.rejected += outcome.rejected
        self.consumer.count_delivery(batch.shard, delivered=count)
        if recovered:
            event(log, "send_recovered", stream=self.consumer.stream, shard=batch.shard,
                  endpoint=self.sink.describe(), failed_attempts=recovered)
        if outcome.rejected:
            event(log, "partial_success", logging.WARNING, stream=self.consumer.stream,
                  shard=batch.shard, key=batch.key, rejected=outcome.rejected,
                  message=outcome.rejected_message)

    def _failed(self, batch: Batch, outcome: Outcome, retry: int) -> None:
        """Counts a retried failure; logs the first of a run of failures, then
        at most one line per status interval while they go on."""
        with self._lock:
            self.stats.retries += 1
            self.stats.failing += 1
            self.stats.last_error = outcome.describe()
            first = self.stats.failing == 1
            now = time.monotonic()
            due = first or now - self._failing_logged >= max(self.config.status_interval_s, 1.0)
            if due:
                self._failing_logged = now
        self.consumer.count_delivery(batch.shard, retries=1)
        if due:
            event(log, "send_failed", logging.WARNING, stream=self.consumer.stream, shard=batch.shard,
                  key=batch.key, endpoint=self.sink.describe(), status=outcome.status or None,
                  error=outcome.describe(), retry=retry, failing=self.stats.failing,
                  retry_after_s=outcome.retry_after_s)

    def _refused(self, batch: Batch, outcome: Outcome) -> None:
        """A permanent answer: the batch's records go to dead letters."""
        fields = {"error": outcome.describe(), "status": outcome.status, "answer": outcome.answer,
                  "endpoint": self.sink.describe()}
        assert batch.entries is not None
        count = self._dead_letter(batch, {i: fields for i in range(len(batch.entries))
                                          if i not in batch.rejected})
        with self._lock:
            self.stats.permanent_failures += 1
            self.stats.last_error = outcome.describe()
        self.consumer.count_delivery(batch.shard, failed=count)
        event(log, "send_refused", logging.ERROR, stream=self.consumer.stream, shard=batch.shard,
              key=batch.key, endpoint=self.sink.describe(), status=outcome.status,
              answer=outcome.answer, records=count, dlq=f"{self.consumer.stream}.dlq")

    def _dead_letter(self, batch: Batch, items: dict[int, dict[str, Any]]) -> int:
        """Stores entries of the batch (by index, with what went wrong) in
        ``<stream>.dlq``; the entries are read again (the batch keeps only
        its request), those retention deleted meanwhile are gone."""
        assert batch.entries is not None
        entries = batch.entries
        read = self.consumer.log.read(self.consumer.stream, batch.shard, entries[0], len(entries),
                                      INTENT_READ_BYTES)
        index = {entry: i for i, entry in enumerate(entries)}
        found = [(k, items[index[e]]) for k, e in enumerate(read.entries) if index.get(e) in items]
        count = store_dead_letters(self.consumer.log, self.consumer.group, read, found)
        with self._lock:
            self.stats.dead_lettered += count
        return count

    # ---- what an operator sees ---------------------------------------------------------

    def report_status(self, force: bool = False) -> None:
        interval = self.config.status_interval_s
        now = time.monotonic()
        if not force and (interval <= 0 or now - self._last_status < interval):
            return
        self._last_status = now
        backlog: dict[str, Any] = {}
        try:
            stats = self.consumer.log.stats(self.consumer.stream, oldest=False)
            stats = replace(stats, groups=[g for g in stats.groups
                                           if g.name == self.consumer.group and g.shard in self.state])
            b = self.consumer.log.backlogs(stats).get(self.consumer.group)
            if b is not None:
                backlog = {"lag": b.entries, "lag_bytes": b.bytes,
                           "oldest_unacked_age_s": round((time.time_ns() - b.oldest_ns) / 1e9, 3)
                           if b.oldest_ns else 0}
        except Exception:  # the counters matter more than the lag
            backlog = {"lag": None}
        with self._lock:
            counters = self.stats.as_dict()
        event(log, "status", stream=self.consumer.stream, group=self.consumer.group,
              endpoint=self.sink.describe(), signal=self.signal, **counters, **backlog,
              in_flight=self._in_flight())
