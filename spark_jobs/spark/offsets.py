"""The ``comet`` source's options, and offsets resolved against the log.

An offset is a position per shard: ``{shard: entry}``, the next entry to
read (Spark wants JSON objects, so shards are string keys there).  A start
position is one of

- ``earliest``: each shard's oldest stored entry;
- ``latest``: each shard's end (only what comes next);
- ``group:<name>``: a consumer group's offsets.  The group must be
  registered on the stream (in at least one shard): a name that is not is an
  error naming the known groups, not a silent read from the start.  In a
  shard where a registered group has no offset (it reads other shards), the
  read starts at the oldest stored entry, as registering it there would.
  The source registers nothing itself; ``comet spark-ship`` registers its
  own group through the storage API, not through this option;
- JSON ``{"0": 120, "3": 7}``: per shard, ``-2`` meaning earliest and ``-1``
  latest; shards left out start at the earliest.

An end position is ``latest`` (the committed ends when the query is
planned) or JSON of the same form.  Every mistake is a ``ValueError`` that
says which option is wrong and why.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Mapping

from storage_c import Config, GroupNotFound, Log, StreamNotFound

EARLIEST, LATEST = -2, -1
DEFAULT_ENTRIES_PER_PARTITION = 1_000_000
DEFAULT_BATCH_ROWS = 50_000
DEFAULT_BATCH_BYTES = 64 << 20

Offsets = dict[int, int]


@dataclass(frozen=True)
class SourceOptions:
    path: str
    stream: str
    shards: tuple[int, ...] | None = None
    starting: str = "earliest"
    ending: str = "latest"
    entries_per_partition: int = DEFAULT_ENTRIES_PER_PARTITION
    batch_rows: int = DEFAULT_BATCH_ROWS
    batch_bytes: int = DEFAULT_BATCH_BYTES
    value_schema: str | None = None
    max_entries_per_trigger: int | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        opts = {k.lower(): v for k, v in options.items()}
        path = opts.get("path")
        stream = opts.get("stream")
        if not path:
            raise ValueError("option 'path' (the Comet data directory) is required")
        if not stream:
            raise ValueError("option 'stream' is required")
        shards = None
        if opts.get("shards"):
            try:
                shards = tuple(sorted({int(s) for s in opts["shards"].split(",") if s.strip()}))
            except ValueError:
                raise ValueError(f"option 'shards' {opts['shards']!r}: use a comma-separated "
                                 "list of shard numbers, for example 0,3,5") from None
        out = cls(
            # Absolute in the driver: executors open it from their own directories.
            path=os.path.abspath(path),
            stream=stream,
            shards=shards,
            starting=opts.get("startingoffsets", "earliest").strip(),
            ending=opts.get("endingoffsets", "latest").strip(),
            entries_per_partition=_positive(opts, "maxentriesperpartition",
                                            DEFAULT_ENTRIES_PER_PARTITION),
            batch_rows=_positive(opts, "batchrows", DEFAULT_BATCH_ROWS),
            batch_bytes=_positive(opts, "batchbytes", DEFAULT_BATCH_BYTES),
            value_schema=opts.get("valueschema") or None,
            max_entries_per_trigger=(_positive(opts, "maxentriespertrigger", 0)
                                     if "maxentriespertrigger" in opts else None),
        )
        check_start(out.starting, "startingOffsets")
        if out.ending != "latest":
            parse_json_offsets(out.ending, "endingOffsets")
        return out


def _positive(opts: Mapping[str, str], key: str, default: int) -> int:
    if key not in opts:
        return default
    try:
        value = int(opts[key])
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(f"option {key!r} must be a positive integer, not {opts[key]!r}")
    return value


def check_start(text: str, what: str) -> None:
    if text in ("earliest", "latest"):
        return
    if text.startswith("group:"):
        if not text[len("group:"):]:
            raise ValueError(f"{what} 'group:' needs a group name, for example group:lake")
        return
    parse_json_offsets(text, what)


def parse_json_offsets(text: str, what: str) -> Offsets:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} is neither earliest, latest, group:<name> nor JSON "
                         f"like {{\"0\": 120}}: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{what} must be a JSON object of shard -> entry, like {{\"0\": 120}}")
    out: Offsets = {}
    for key, value in raw.items():
        try:
            shard = int(key)
        except ValueError:
            raise ValueError(f"{what}: {key!r} is not a shard number") from None
        if isinstance(value, bool) or not isinstance(value, int) or value < EARLIEST or shard < 0:
            raise ValueError(f"{what}: shard {key}: {value!r} is not an entry number "
                             "(or -2 earliest, -1 latest)")
        out[shard] = value
    return out


def open_log(path: str) -> Log:
    """The source only reads (it registers and acknowledges nothing): an
    inspector creates nothing, runs no flusher and claims no slot."""
    return Log(path, Config.inspector())


def shard_list(log: Log, opts: SourceOptions) -> list[int]:
    """The shards to read; the stream must exist."""
    try:
        count = log.shard_count(opts.stream)
    except StreamNotFound:
        raise ValueError(f"stream {opts.stream!r} does not exist in {opts.path}") from None
    if opts.shards is None:
        return list(range(count))
    bad = [s for s in opts.shards if s >= count]
    if bad:
        raise ValueError(f"option 'shards': stream {opts.stream!r} has {count} shards "
                         f"(0..{count - 1}); no shard {bad[0]}")
    return list(opts.shards)


def bounds(log: Log, stream: str, shard: int) -> tuple[int, int]:
    """The shard's oldest stored entry and its committed end."""
    st = log.shard_stats(stream, shard)
    return st.first_entry, st.next_entry


def resolve_start(log: Log, opts: SourceOptions, shards: list[int], text: str) -> Offsets:
    out: Offsets = {}
    explicit = None if text in ("earliest", "latest") or text.startswith("group:") \
        else parse_json_offsets(text, "startingOffsets")
    if text.startswith("group:"):
        check_group_known(log, opts.stream, text[len("group:"):])
    for shard in shards:
        first, end = bounds(log, opts.stream, shard)
        if text == "earliest":
            out[shard] = first
        elif text == "latest":
            out[shard] = end
        elif text.startswith("group:"):
            out[shard] = group_offset(log, opts.stream, shard, text[len("group:"):], first)
        else:
            assert explicit is not None
            want = explicit.get(shard, EARLIEST)
            out[shard] = first if want == EARLIEST else end if want == LATEST else min(want, end)
    return out


def check_group_known(log: Log, stream: str, group: str) -> None:
    """``startingOffsets=group:<name>`` names a group registered on the stream."""
    known = sorted({g.name for g in log.groups(stream)})
    if group not in known:
        raise ValueError(
            f"startingOffsets: consumer group {group!r} is not registered on stream {stream!r}; "
            f"known groups: {', '.join(known) or '(none)'} (register it first, e.g. "
            f"consumers.Consumer(path, {stream!r}, {group!r}).shards(), or use "
            "startingOffsets=earliest)")


def group_offset(log: Log, stream: str, shard: int, group: str, first: int) -> int:
    try:
        return log.group(stream, shard, group, create=False).offset
    except GroupNotFound:
        return first


def resolve_end(log: Log, opts: SourceOptions, shards: list[int]) -> Offsets:
    """Where a batch query stops: the committed ends now, or the given ones
    (never beyond what is committed)."""
    explicit = None if opts.ending == "latest" else parse_json_offsets(opts.ending, "endingOffsets")
    out: Offsets = {}
    for shard in shards:
        _, end = bounds(log, opts.stream, shard)
        want = LATEST if explicit is None else explicit.get(shard, LATEST)
        if want == EARLIEST:
            raise ValueError(f"endingOffsets: shard {shard}: -2 (earliest) cannot end a query")
        out[shard] = end if want == LATEST else min(want, end)
    return out


def cap(begin: Offsets, ends: Offsets, most: int | None) -> Offsets:
    """Per shard, the end - or, with ``most``, at most that many new entries
    in all, shared round-robin so no shard starves."""
    start = {s: min(begin.get(s, e), e) for s, e in ends.items()}
    if most is None:
        return dict(ends)
    out = dict(start)
    left = most
    open_shards = [s for s in sorted(ends) if out[s] < ends[s]]
    while left > 0 and open_shards:
        share = max(1, left // len(open_shards))
        for s in list(open_shards):
            take = min(share, ends[s] - out[s], left)
            out[s] += take
            left -= take
            if out[s] >= ends[s]:
                open_shards.remove(s)
            if left == 0:
                break
    return out


def to_json(offsets: Offsets) -> dict[str, int]:
    return {str(k): v for k, v in sorted(offsets.items())}


def from_json(raw: Mapping[str, int]) -> Offsets:
    return {int(k): int(v) for k, v in raw.items()}
