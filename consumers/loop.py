"""The processing loop behind ``Consumer.process``.

One batch at a time per shard: call the handler; on failure retry with
exponential backoff and jitter, telling ``on_error`` about every failure;
after ``max_retries`` retries, either send the batch to the dead-letter stream
``<stream>.dlq`` (each entry wrapped with its original id and the error) and
move the offset on, or raise - never retry silently forever.  The offset is
acknowledged only after the handler returned (or the dead letters are
stored), so a crash at any point redelivers, never loses.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Protocol

import orjson

from comet.backoff import backoff_delay
from comet.export import json_value
from storage_c import Log, ReadBatch


class GroupReader(Protocol):
    """What the loop needs of a consumer group's reader (``Consumer``)."""

    log: Log
    group: str

    def read(self, max_entries: int = ...) -> ReadBatch: ...

    def ack_batch(self, batch: ReadBatch) -> int: ...


class ProcessingError(Exception):
    """A batch kept failing after every retry and dead letters are off."""

    def __init__(self, batch: ReadBatch, attempts: int, cause: BaseException) -> None:
        first = batch.entries[0] if len(batch) else batch.next_entry
        super().__init__(f"handler failed {attempts} times on {batch.stream} shard {batch.shard} "
                         f"entries {first}..{batch.next_entry - 1}: {cause!r}")
        self.batch = batch
        self.attempts = attempts
        self.__cause__ = cause


@dataclass
class ProcessStats:
    batches: int = 0
    entries: int = 0
    failures: int = 0
    dead_lettered: int = 0


def stopper(stop: Callable[[], bool] | object | None) -> Callable[[], bool]:
    if stop is None:
        return lambda: False
    if isinstance(stop, threading.Event):
        return stop.is_set
    if callable(stop):
        return stop
    raise TypeError("stop is a threading.Event or a callable returning bool")


def sleep_unless(stopped: Callable[[], bool], seconds: float) -> None:
    """Sleeps in short steps so that a stop request is noticed quickly."""
    deadline = time.monotonic() + seconds
    while not stopped():
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, 0.05))


def dead_letter(consumer: GroupReader, batch: ReadBatch, error: BaseException, attempts: int) -> None:
    """Stores every entry of the batch in <stream>.dlq with where it came from
    (``store_dead_letters``)."""
    fields = {"attempts": attempts, "error": repr(error)}
    store_dead_letters(consumer.log, consumer.group, batch, ((i, fields) for i in range(len(batch))))


def store_dead_letters(log: Log, group: str, batch: ReadBatch,
                       items: Iterable[tuple[int, Mapping[str, object]]]) -> int:
    """Stores entries of the batch (by index, each with fields that say what
    went wrong) in ``<stream>.dlq``, durably, in the shard they came from;
    ``payload`` is the entry's JSON as stored, or the envelope
    ``{"base64": ...}`` of a payload that is not JSON (comet.export).
    Returns how many."""
    payloads = batch.payloads
    records = [
        orjson.dumps({
            "id": f"{batch.shard}-{batch.entries[i]}",
            "stream": batch.stream,
            "shard": batch.shard,
            "entry": batch.entries[i],
            "timestamp": batch.timestamps[i],
            "group": group,
            **fields,
            "payload": json_value(payloads[i]),
        })
        for i, fields in items
    ]
    if records:
        dlq = f"{batch.stream}.dlq"
        log.create_stream(dlq, log.shard_count(batch.stream))
        log.append_batch(dlq, records, shard=batch.shard, durability="always")
    return len(records)


HANDLED, DEAD_LETTERED, INTERRUPTED = "handled", "dead-lettered", "interrupted"


def handle(consumer: GroupReader, batch: ReadBatch, handler: Callable[[ReadBatch], object],
           stats: ProcessStats, stopped: Callable[[], bool], *, max_retries: int,
           retry_backoff: float, max_backoff: float,
           on_error: Callable[[BaseException, ReadBatch, int], object] | None,
           dead_letters: bool) -> str:
    """Runs the handler with retries; says how the batch ended."""
    retry = 0
    while True:
        try:
            handler(batch)
            return HANDLED
        except Exception as exc:  # the handler's failure, whatever it is
            stats.failures += 1
            if on_error is not None:
                on_error(exc, batch, retry)
            if retry >= max_retries:
                if not dead_letters:
                    raise ProcessingError(batch, retry + 1, exc) from exc
                dead_letter(consumer, batch, exc, retry + 1)
                stats.dead_lettered += len(batch)
                return DEAD_LETTERED
            sleep_unless(stopped, backoff_delay(retry, retry_backoff, max_backoff))
            if stopped():
                return INTERRUPTED  # not acknowledged: the next run gets it again
            retry += 1


def process_batches(consumer: GroupReader, handler: Callable[[ReadBatch], object], *,
                    batch_size: int, poll_interval: float, max_retries: int,
                    retry_backoff: float, max_backoff: float,
                    on_error: Callable[[BaseException, ReadBatch, int], object] | None,
                    on_batch: Callable[[ReadBatch], object] | None, auto_ack: bool,
                    dead_letter: bool, stop: Callable[[], bool] | object | None) -> ProcessStats:
    if max_retries < 0:
        raise ValueError("max_retries must be >= 0")
    stopped = stopper(stop)
    stats = ProcessStats()
    while not stopped():
        batch = consumer.read(batch_size)
        if not len(batch) and not batch.skipped:
            sleep_unless(stopped, poll_interval)
            continue
        outcome = HANDLED
        if len(batch):
            outcome = handle(consumer, batch, handler, stats, stopped, max_retries=max_retries,
                             retry_backoff=retry_backoff, max_backoff=max_backoff,
                             on_error=on_error, dead_letters=dead_letter)
            if outcome == INTERRUPTED:
                break
        # With auto_ack off the handler acknowledges; dead letters always move on.
        if auto_ack or outcome == DEAD_LETTERED or not len(batch):
            consumer.ack_batch(batch)
        stats.batches += 1
        stats.entries += len(batch)
        if on_batch is not None:
            on_batch(batch)
    return stats
