"""The one no-loss check of the tests and the load tests: every acknowledged event is
stored exactly once, where its 202 said, and no event is stored twice.

What the clients were told goes into ``Acks``: each 202 (the stream, shard and entry
range it names, and the request it answered), each error status, each request that got
no answer.  Every stored event names its request and its number: the fields ``"r"``
and ``"i"`` of its JSON.  ``check`` reads the log (and, for a soak, the objects
``comet ship`` wrote before retention deleted their segments) against the ``Acks``:

- ``Poster`` threads (posters.py) post numbered NDJSON events and fill ``Acks`` as they go;
  ``check_stored_once`` checks what they were told (the gateway's tests);
- locust's processes write every answer to ``acks-<pid>.ndjson``; ``locust_acks``
  reads those files (loadtests/loadtest.py);
- wrk sends one body over and over, so its events carry no identity:
  ``check_stored_count`` is the exact check by count alone (loadtests/bench_gateway.py).

``exact`` (the load tests, the reload test) adds: every stored event was acknowledged,
so stored events == acknowledged events.  Without it, an event whose request got no
answer (a worker killed under it) may be stored, once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, NamedTuple, Protocol, Sequence

import orjson
import zstandard

from storage_c import CometError, Config, Log, StreamNotFound


READ_CONFIG = Config(create=False, auto_create_streams=False, background_flush=False,
                     retention_interval_ms=0)


class Ack(NamedTuple):
    """A 202: entries ``first``..``last`` hold events ``base``.. of request ``rid``."""

    first: int
    last: int
    rid: str
    key: str | None
    base: int = 0


@dataclass
class Acks:
    """What the clients were told."""

    by_shard: dict[tuple[str, int], list[Ack]] = field(default_factory=dict)
    rids: set[str] = field(default_factory=set)
    failed: dict[str, int] = field(default_factory=dict)  # rid -> status (0: no answer came)
    requests: int = 0
    events: int = 0
    bad_lines: int = 0  # unreadable records (a line cut short by a killed process)

    def acknowledged(self, stream: str, shard: int, first: int, count: int, rid: str,
                     key: str | None = None, base: int = 0) -> None:
        self.by_shard.setdefault((stream, shard), []).append(
            Ack(first, first + count - 1, rid, key, base))
        self.rids.add(rid)
        self.requests += 1
        self.events += count

    def refused(self, rid: str, status: int) -> None:
        """An error status (0: no answer at all)."""
        self.failed[rid] = status


def locust_acks(directory: Path) -> Acks:
    """The answers loadtests/locustfile.py recorded in ``directory``/acks-*.ndjson: per
    request ``{"r", "s", "sh", "f", "l", "n", "k"}`` for a 202, ``{"r", "s", "n", "st"}``
    for an error status (0: none came)."""
    acks = Acks()
    for path in sorted(Path(directory).glob("acks-*.ndjson")):
        for line in path.read_bytes().splitlines():
            try:
                r = orjson.loads(line)
                rid = str(r["r"])
                if "st" in r:
                    acks.refused(rid, int(r["st"]))
                    continue
                stream, shard, first, last = str(r["s"]), int(r["sh"]), int(r["f"]), int(r["l"])
                count, key = int(r["n"]), r.get("k")
            except (ValueError, KeyError, TypeError):
                acks.bad_lines += 1
                continue
            acks.acknowledged(stream, shard, first, count, rid, key)
            if last != first + count - 1:
                acks.bad_lines += 1
    return acks


PROBLEMS = (("lost", "acknowledged events lost"), ("duplicates", "events stored twice"),
            ("stored_after_error", "events stored although the gateway answered an error"),
            ("foreign", "entries that no request of this run sent"),
            ("overlapping_acks", "202s claiming the same entries"),
            ("wrong_shard_keys", "keyed requests outside their key's shard"),
            ("overlapping_objects", "shipped objects overlapping"),
            ("bad_objects", "shipped objects whose line count does not match their key"),
            ("retention_lost_entries", "entries retention deleted before shipping"),
            ("deleted_unshipped", "entries retention deleted that no shipped object holds"),
            ("bad_record_lines", "unreadable lines in the clients' records"))
EXACT_PROBLEMS = (("unanswered_stored", "events stored whose request got no answer (not a "
                                        "loss, but stored != acknowledged)"),)


@dataclass
class NoLossReport:
    exact: bool = True
    acked_requests: int = 0
    acked_events: int = 0
    stored_events: int = 0        # found in the log, plus (soak) shipped then deleted by retention
    in_log: int = 0               # between each shard's first and next entry
    deleted_by_retention: int = 0  # below each shard's first entry
    shipped_only: int = 0         # of those, found in the sink
    shipped_events: int = 0       # lines in the sink's objects
    matched: int = 0              # acknowledged events found where their 202 said
    lost: int = 0                 # acknowledged events not found where their 202 said
    misplaced: int = 0            # of lost: another entry in an acknowledged position
    missing_positions: int = 0    # entry numbers in neither the log nor the sink
    duplicates: int = 0           # acknowledged events outside their range, any event twice
    stored_after_error: int = 0
    unanswered_stored: int = 0    # events of a request whose answer the client never got
    foreign: int = 0
    overlapping_acks: int = 0
    wrong_shard_keys: int = 0
    overlapping_objects: int = 0
    bad_objects: int = 0
    retention_deleted_segments: int = 0
    retention_lost_entries: int = 0   # counted by the storage (force_delete_after)
    bad_record_lines: int = 0
    examples: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        if len(self.examples) < 20:
            self.examples.append(text)

    @property
    def deleted_unshipped(self) -> int:
        return max(0, self.deleted_by_retention - self.shipped_only)

    @property
    def problems(self) -> list[str]:
        kinds = PROBLEMS + (EXACT_PROBLEMS if self.exact else ())
        out = [f"{getattr(self, name)} {what}" for name, what in kinds if getattr(self, name)]
        if self.exact and not out and self.stored_events != self.acked_events:
            out.append(f"{self.stored_events} events stored != {self.acked_events} acknowledged")
        return out + (["no request was acknowledged"] if self.acked_requests == 0 else [])

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok, "problems": self.problems}


def check(data_dir: Path, acks: Acks, sink: Path | None = None, *, exact: bool = True) -> NoLossReport:
    """Reads the log (and the sink of `comet ship`, when given) against ``acks``."""
    rep = NoLossReport(exact=exact, acked_requests=acks.requests, acked_events=acks.events,
                       bad_record_lines=acks.bad_lines)
    unmatched: set[tuple[str, int]] = set()  # events stored outside any 202 of theirs
    with Log(data_dir, READ_CONFIG) as log:
        for stream in sorted(set(log.streams()) | {s for s, _ in acks.by_shard}):
            try:
                shards = log.shard_count(stream)
            except StreamNotFound:
                shards = 0
            objects = sink_objects(sink, stream)
            for shard in sorted(set(range(shards)) | {s for (st, s) in acks.by_shard if st == stream}):
                check_shard(log, stream, shard, shard < shards, acks, objects.get(shard, []), rep,
                            unmatched)
            if shards:
                stats = log.stats(stream)
                rep.retention_deleted_segments += stats.total("retention_deleted_segments")
                rep.retention_lost_entries += stats.total("retention_lost_entries")
        for (stream, shard), ranges in acks.by_shard.items():
            for ack in ranges:
                try:
                    want = log.shard_for_key(stream, ack.key) if ack.key is not None else shard
                except CometError:
                    continue
                if want != shard:
                    rep.wrong_shard_keys += 1
                    rep.note(f"request {ack.rid} with key {ack.key!r} went to shard {shard}, not {want}")
    rep.lost = rep.acked_events - rep.matched
    return rep


def check_shard(log: Log, stream: str, shard: int, exists: bool, acks: Acks,
                objects: list[tuple[int, int, Path]], rep: NoLossReport,
                unmatched: set[tuple[str, int]]) -> None:
    ranges = sorted(acks.by_shard.get((stream, shard), []))
    for a, b in zip(ranges, ranges[1:]):
        if b.first <= a.last:
            rep.overlapping_acks += 1
            rep.note(f"{stream}/{shard}: 202s of {a.rid} [{a.first}, {a.last}] and {b.rid} "
                     f"[from {b.first}] overlap")
    if not exists:
        rep.note(f"{stream}/{shard}: acknowledged, but the shard does not exist")
        return
    stats = log.shard_stats(stream, shard)
    rep.in_log += stats.next_entry - stats.first_entry
    rep.deleted_by_retention += stats.first_entry
    j = 0
    for entry, payload in shard_entries(log, stream, shard, stats.first_entry, stats.next_entry,
                                        objects, rep):
        rep.stored_events += 1
        while j < len(ranges) and ranges[j].last < entry:
            j += 1
        try:
            event = orjson.loads(payload)
            rid, number = str(event["r"]), int(event["i"])
        except (ValueError, KeyError, TypeError):
            rid, number = "", -1
        acked_here = j < len(ranges) and ranges[j].first <= entry
        if acked_here:
            ack = ranges[j]
            if rid == ack.rid and number == ack.base + entry - ack.first:
                rep.matched += 1
                continue
            rep.misplaced += 1
            rep.note(f"{stream}/{shard}-{entry}: acknowledged for event {ack.base + entry - ack.first} "
                     f"of {ack.rid}, holds {rid or payload[:60]!r} {number}")
        where = f"{stream}/{shard}-{entry}: event {number} of {rid}"
        if not rid:
            rep.foreign += 1
            rep.note(f"{stream}/{shard}-{entry}: not an event of this run: {payload[:80]!r}")
        elif rid in acks.rids or (rid, number) in unmatched:
            rep.duplicates += 1
            rep.note(f"{where}, stored twice or outside its 202's range")
        elif acks.failed.get(rid, 0) > 0:
            rep.stored_after_error += 1
            rep.note(f"{where}, answered with {acks.failed[rid]}")
        elif rid in acks.failed or not acked_here:
            rep.unanswered_stored += 1  # no answer, or no record at all: the client died
        unmatched.add((rid, number))


def sink_objects(sink: Path | None, stream: str) -> dict[int, list[tuple[int, int, Path]]]:
    """shard -> [(first, last, path)] of the sink's objects of ``stream`` (under
    ``stream=<stream>/``, or ``<stream>/`` as `comet ship` wrote before), sorted."""
    out: dict[int, list[tuple[int, int, Path]]] = {}
    tops = [] if sink is None else [sink / f"stream={stream}", sink / stream]
    for path in (p for top in tops if top.is_dir() for p in top.rglob("*.ndjson.zst")):
        first, last = (int(x) for x in path.name[: -len(".ndjson.zst")].split("-"))
        out.setdefault(int(path.parent.name.split("=", 1)[1]), []).append((first, last, path))
    for objects in out.values():
        objects.sort()
    return out


def log_entries(log: Log, stream: str, shard: int, start: int, stop: int) -> Iterator[tuple[int, bytes]]:
    """Stored entries of [start, stop) (retention may have deleted a prefix)."""
    pos = start
    while pos < stop:
        batch = log.read(stream, shard, pos, min(4096, stop - pos))
        if not len(batch):
            if batch.next_entry <= pos:
                return
            pos = batch.next_entry  # skipped (deleted or damaged) up to there
            continue
        for entry, payload in zip(batch.entries, batch.payloads):
            if entry >= stop:
                return
            yield entry, payload
        pos = batch.next_entry


def shard_entries(log: Log, stream: str, shard: int, start: int, end: int,
                  objects: list[tuple[int, int, Path]], rep: NoLossReport) -> Iterator[tuple[int, bytes]]:
    """Entries 0..end-1 of a shard in order: from the sink where an object holds them,
    from the log otherwise; counts positions found in neither."""
    pos, k = 0, 0
    while True:
        nxt = objects[k] if k < len(objects) else None
        if nxt is not None and nxt[0] <= pos:
            first, last, path = nxt
            k += 1
            if first < pos:
                rep.overlapping_objects += 1
                rep.note(f"object {path.name} (shard {shard}) overlaps the one before")
            lines = zstandard.ZstdDecompressor().decompress(path.read_bytes()).splitlines()
            rep.shipped_events += len(lines)
            if len(lines) != last - first + 1:
                rep.bad_objects += 1
                rep.note(f"object {path.name} (shard {shard}) holds {len(lines)} lines")
            for j, line in enumerate(lines):
                if first + j >= pos:
                    rep.shipped_only += first + j < start
                    yield first + j, line
            pos = max(pos, last + 1)
            continue
        stop = end if nxt is None else nxt[0]
        expect = pos
        for entry, payload in log_entries(log, stream, shard, pos, stop):
            rep.missing_positions += entry - expect
            yield entry, payload
            expect = entry + 1
        rep.missing_positions += max(0, stop - expect)
        pos = max(pos, stop)
        if nxt is None:
            return


def check_stored_count(data_dir: Path, stream: str, acknowledged: int) -> dict[str, Any]:
    """The exact check where the events carry no identity (wrk posts one body over and
    over): the stream holds as many entries as the 202s acknowledged events."""
    with Log(data_dir, READ_CONFIG) as log:
        stored = int(log.stats(stream).entries) if stream in log.streams() else 0
    return {"stored_events": stored, "acknowledged_events": acknowledged,
            "stored_equals_acknowledged": stored == acknowledged}


class AckRecorder(Protocol):
    """A client that records what it was told in ``acks`` (posters.py's ``Poster``)."""

    acks: Acks


def merged(clients: Sequence[AckRecorder]) -> Acks:
    out = Acks()
    for c in clients:
        for key, ranges in c.acks.by_shard.items():
            out.by_shard.setdefault(key, []).extend(ranges)
        out.rids |= c.acks.rids
        out.failed.update(c.acks.failed)
        out.requests += c.acks.requests
        out.events += c.acks.events
        out.bad_lines += c.acks.bad_lines
    return out


def check_stored_once(data_dir: Path, clients: Sequence[AckRecorder], *, exact: bool = False) -> int:
    """Asserts that every event acknowledged to ``clients`` is stored exactly once, where
    its 202 said, and that no event is stored twice (``exact``: and nothing else is
    stored).  Returns the number of acknowledged events."""
    report = check(data_dir, merged(clients), exact=exact)
    assert report.ok, f"{report.problems}; e.g. {report.examples[:5]}"
    return report.acked_events
