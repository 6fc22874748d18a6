"""GET /streams/{name}/entries: reading a stream back over HTTP, a page at a time.

Without ``shard``: the whole stream, its shards merged in entry-time order
(timestamp, then shard, then entry), ``limit`` entries a page.  The page's
``next`` is a cursor, an opaque string that the client passes back as
``cursor=`` to read on from exactly where the page stopped.  It holds, for
every shard, the first entry not yet returned, so no entry is ever repeated
or skipped, whatever is appended in between.  An entry stored in one shard
after a page was read comes in a later page even when its timestamp is older
than that page's last one: pages are in time order within what each one saw.

With ``shard=N`` (and ``from=E``, by default the shard's first entry): that
shard alone, in entry order; ``next`` is the entry number to read from next.

Every entry names its shard and entry (``id`` is ``"<shard>-<entry>"``);
``skipped`` counts entries passed over because retention deleted them or
they are damaged (never silently).
"""

from __future__ import annotations

import base64
import binascii
import heapq
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import orjson

from comet.export import json_value
from storage_c import CometError, Log, StreamStats

from .errors import HTTPError, check_name, storage_error
from .runtime import Runtime

READ_BYTES = 4 << 20    # payload bytes of one answer at most (at least one entry is returned)
CHUNK = 64              # entries asked of one shard at a time while merging
CHUNK_BYTES = 256 << 10  # and their bytes at most, so that 16 shards' chunks hold READ_BYTES
DEFAULT_LIMIT = 100


def read(runtime: Runtime, name: str, params: Mapping[str, str]) -> dict[str, Any]:
    """One page of ``name`` as the query ``params`` ask (blocking: run it on a thread)."""
    check_name(name)
    log = runtime.log
    assert log is not None
    retry = runtime.config.retry_after_s
    try:
        stats = log.stats(name, oldest=False)
        limit = int_param(params, "limit", DEFAULT_LIMIT, 1, runtime.config.max_entries_per_read)
        if "shard" in params or "from" in params:
            if "cursor" in params:
                raise HTTPError(400, "bad_parameter", "give cursor (to read the whole stream on) "
                                "or shard and from (one shard), not both")
            if "shard" not in params:
                raise HTTPError(400, "bad_parameter", "from is an entry number of one shard: give "
                                "shard too, or leave both out to read the whole stream")
            return _one_shard(log, stats, params, limit)
        cursor = params.get("cursor")
        start = (Cursor.decode(cursor, stats) if cursor is not None
                 else Cursor(name, [s.first_entry for s in stats.shards]))
        return _merged(log, start, limit)
    except CometError as exc:
        raise storage_error(exc, retry) from None


def int_param(params: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise HTTPError(400, "bad_parameter", f"{name} must be an integer, not {raw!r}") from None
    if not low <= value <= high:
        raise HTTPError(400, "bad_parameter", f"{name} must be between {low} and {high}")
    return value


def _entry(shard: int, entry: int, timestamp: int, payload: bytes) -> dict[str, Any]:
    return {"shard": shard, "entry": entry, "id": f"{shard}-{entry}", "timestamp": timestamp,
            "value": json_value(payload)}


def _one_shard(log: Log, stats: StreamStats, params: Mapping[str, str],
               limit: int) -> dict[str, Any]:
    shard = int_param(params, "shard", 0, 0, len(stats.shards) - 1)
    start = int_param(params, "from", stats.shards[shard].first_entry, 0, 2**63 - 1)
    batch = log.read(stats.stream, shard, start, limit, max_bytes=READ_BYTES)
    return {"stream": stats.stream, "shard": shard, "next": batch.next_entry,
            "skipped": batch.skipped,
            "entries": [_entry(shard, e.entry, e.timestamp, e.payload) for e in batch]}


@dataclass
class Cursor:
    """Where a whole-stream read goes on: per shard, the first entry not yet returned."""

    stream: str
    positions: list[int]

    def encode(self) -> str:
        raw = orjson.dumps([self.stream, self.positions])
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    @classmethod
    def decode(cls, text: str, stats: StreamStats) -> Cursor:
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
            stream, positions = orjson.loads(raw)
            if not (isinstance(stream, str) and isinstance(positions, list)
                    and all(type(p) is int and p >= 0 for p in positions)):
                raise ValueError(positions)
        except (binascii.Error, ValueError, TypeError):  # orjson's decode error is a ValueError
            raise HTTPError(400, "bad_cursor", "cursor is not one this gateway handed out: pass "
                            "back the \"next\" of the previous page unchanged") from None
        if stream != stats.stream:
            raise HTTPError(400, "bad_cursor", f"cursor is one of stream {stream!r}, "
                            f"not of {stats.stream!r}")
        shards = stats.shards
        if len(positions) != len(shards) or any(p > s.next_entry for p, s in zip(positions, shards)):
            raise HTTPError(400, "bad_cursor", f"cursor does not fit stream {stats.stream!r} "
                            "as it is now (deleted and created again?): start again without one")
        return cls(stream, positions)


class _ShardReader:
    """One shard's entries from ``position`` on, read CHUNK at a time as the merge asks."""

    def __init__(self, log: Log, stream: str, shard: int, position: int) -> None:
        self.log, self.stream, self.shard = log, stream, shard
        self.position = position      # the first entry not returned
        self.end: int | None = None   # where the shard ended, once the merge has taken it all

    def entries(self) -> Iterator[tuple[int, int, int, bytes]]:
        at = self.position
        while True:
            batch = self.log.read(self.stream, self.shard, at, CHUNK, max_bytes=CHUNK_BYTES)
            if not len(batch):
                self.end = batch.next_entry
                return
            for e in batch:
                yield e.timestamp, self.shard, e.entry, e.payload
            at = batch.next_entry


def _merged(log: Log, start: Cursor, limit: int) -> dict[str, Any]:
    readers = [_ShardReader(log, start.stream, shard, position)
               for shard, position in enumerate(start.positions)]
    taken: list[tuple[int, int, int, bytes]] = []
    size = 0
    # heapq.merge asks a shard for its next entry only after it handed on the
    # last one, and every entry handed on is taken: each shard's position
    # moves over exactly the entries returned (and what lies between them).
    merged = heapq.merge(*(r.entries() for r in readers))
    for item in merged:
        taken.append(item)
        readers[item[1]].position = item[2] + 1
        size += len(item[3])
        if len(taken) >= limit or size >= READ_BYTES:
            break
    counts = [0] * len(readers)
    for _, shard, _, _ in taken:
        counts[shard] += 1
    skipped = 0
    for reader, old, count in zip(readers, start.positions, counts):
        if reader.end is not None:  # every entry of this shard was taken: on to where it ended
            reader.position = max(reader.position, reader.end)
        skipped += reader.position - old - count
    return {"stream": start.stream,
            "next": Cursor(start.stream, [r.position for r in readers]).encode(),
            "skipped": skipped,
            "entries": [_entry(shard, entry, ts, payload) for ts, shard, entry, payload in taken]}
