"""``comet lake check``: is the lake whole, and does it hold each entry once?

- Every file the two tables reference exists, has the size its add action
  says, and reads: its Parquet footer's row count is the add action's
  ``numRecords``.
- Per stream incarnation and shard, the committed ``_comet_entry`` values
  of the rows and of the rejects have no duplicate, and lie within the runs'
  ranges.
- Per shipper (stream incarnation and group) and shard, the runs' ranges
  (``comet.ranges`` of each run's commit) follow each other with no gap and no overlap.
- With the data directory: the ranges agree with the group's offsets (the
  group is not acked past the last run's end).

A file's incarnation is that of the commit that added it; a file that a
compaction wrote holds the rows of the files it replaced, so it has their
incarnations (a compaction that merged two incarnations' rows in one hour's
partition leaves files of two incarnations: those rows are checked per
stream instead).

Safe beside running ``comet spark-ship`` runs: the group's offsets are read
first, then one version of the main table, then the rejects table - a run
acks only after its commit, so every ack read is covered by that version;
rejects of a run the main table's version does not have (a run between its
two commits) are left out.  Files of that version stay while it is read:
vacuum keeps replaced files for at least a day.
"""

from __future__ import annotations

import json
import posixpath
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np

from .delta import LakeTable
from .history import commit_actions
from .lakefs import Lake

if TYPE_CHECKING:
    from deltalake import DeltaTable

EXAMPLES = 5
"""How many entries a problem names (then: "and N more")."""
Incarnation = int | None
"""A stream incarnation; None: a commit that does not say it."""


@dataclass(frozen=True)
class Origin:
    """Where a file's rows come from."""

    incarnations: frozenset[Incarnation]
    """Empty: unknown (its commit is gone from the log, or was no run's)."""
    app: str | None = None
    run: int | None = None


@dataclass
class RunRanges:
    app: str
    stream: str
    incarnation: Incarnation
    group: str | None
    run: int
    version: int
    ranges: dict[int, tuple[int, int]]
    """Per shard, the run's ``[start, end)`` range."""
    rows: int = 0
    rejects: int = 0


@dataclass
class TableLog:
    """What a table's commits say: where each file's rows come from, the runs."""

    origins: dict[str, Origin] = field(default_factory=dict)
    runs: list[RunRanges] = field(default_factory=list)
    unreadable: list[int] = field(default_factory=list)
    """Versions whose commit file could not be read (a cleaned-up log)."""


@dataclass
class CheckReport:
    lake: str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    tables: dict[str, Any] = field(default_factory=dict)
    streams: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"lake": self.lake, "ok": self.ok, "problems": self.problems, "notes": self.notes,
                "tables": self.tables, "streams": self.streams}


def check(lake: Lake, data_dir: str | None = None, group: str = "spark-ship") -> CheckReport:
    report = CheckReport(lake.url)
    offsets = read_offsets(data_dir, group) if data_dir else None  # first: see the module's doc
    main_table, rejects_table = LakeTable.main(lake), LakeTable.rejects(lake)
    main = main_table.open()
    rejects = rejects_table.open()
    if main is None:
        report.problems.append(f"{lake.url} has no Delta table")
        return report
    main_log = read_log(main_table, main)
    committed: dict[str, int] = {}
    for r in main_log.runs:
        committed[r.app] = max(committed.get(r.app, 0), r.run)
    rejects_log = read_log(rejects_table, rejects) if rejects is not None else TableLog()
    entries: dict[tuple[str, frozenset[Incarnation], int], list[np.ndarray]] = defaultdict(list)
    counts: dict[tuple[str, str, frozenset[Incarnation]], int] = defaultdict(int)
    for table, opened, table_log in ((main_table, main, main_log),
                                     (rejects_table, rejects, rejects_log)):
        if opened is None:
            continue
        for version in table_log.unreadable:
            report.notes.append(f"{table.name}: the commit of version {version} is gone from the "
                                "log: the files it added are checked as of unknown origin")
        report.tables[table.name] = check_files(table, opened, table_log, committed, entries, counts,
                                                report)
    runs = main_log.runs
    check_ranges(runs, report)
    check_counts(counts, runs, report)
    check_entries(entries, runs, report)
    if offsets is not None:
        check_offsets(offsets, runs, group, report)
    report.streams = summary(runs, entries)
    return report


# ---- the log --------------------------------------------------------------------------------

def read_log(table: LakeTable, opened: DeltaTable) -> TableLog:
    """Replays the table's commits up to ``opened``'s version."""
    out = TableLog()
    for version in range(opened.version() + 1):
        actions = commit_actions(table, version)
        if actions is None:
            out.unreadable.append(version)
            continue
        info: dict[str, Any] = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        adds = [a["add"] for a in actions if "add" in a]
        removes = [a["remove"] for a in actions if "remove" in a]
        if "comet.app" in info:
            incarnation = _int(info.get("comet.incarnation"))
            app, run = str(info["comet.app"]), int(info["comet.run"])
            origin = Origin(frozenset([incarnation]), app, run)
            for add in adds:
                out.origins[add["path"]] = origin
            out.runs.append(RunRanges(app, str(info.get("comet.stream")), incarnation,
                                      info.get("comet.group"), run, version,
                                      {int(s): (int(a), int(b))
                                       for s, (a, b) in json.loads(info["comet.ranges"]).items()},
                                      int(info.get("comet.rows", 0)), int(info.get("comet.rejects", 0))))
        else:  # a compaction: its files hold the rows of the files it removed, partition by partition
            by_partition: dict[tuple[str, ...], set[Incarnation]] = defaultdict(set)
            for remove in removes:
                removed = out.origins.get(remove["path"])
                by_partition[_partition(remove)] |= set(removed.incarnations) if removed else set()
            for add in adds:  # (an add of no run and no compaction: of unknown origin, no incarnation)
                out.origins[add["path"]] = Origin(frozenset(by_partition.get(_partition(add), set())))
    return out


def _partition(action: dict[str, Any]) -> tuple[str, ...]:
    values = action.get("partitionValues") or {}
    return tuple(str(values.get(k)) for k in ("stream", "dt", "hour"))


# ---- the files --------------------------------------------------------------------------------

def check_files(table: LakeTable, opened: DeltaTable, table_log: TableLog, committed: dict[str, int],
                entries: dict[tuple[str, frozenset[Incarnation], int], list[np.ndarray]],
                counts: dict[tuple[str, str, frozenset[Incarnation]], int],
                report: CheckReport) -> dict[str, Any]:
    """Checks every file of the table's version; collects its entries."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    adds = pa.table(opened.get_add_actions(flatten=True)).to_pylist()
    shard_col, entry_col = ("_comet_shard", "_comet_entry") if table.name == "main" else ("shard", "entry")
    rows = skipped = 0
    for add in adds:
        rel = str(add["path"])
        where = f"{table.name}: file {rel}"
        origin = table_log.origins.get(rel, Origin(frozenset()))
        if origin.app is not None and origin.run is not None and \
                committed.get(origin.app, 0) < origin.run and table.name == "rejects":
            skipped += 1  # a run between its two commits: its rows are not committed yet
            continue
        path = posixpath.join(table.root, rel)
        info = table.lake.fs.get_file_info(path)
        if info.type.name == "NotFound":
            report.problems.append(f"{where} is missing")
            continue
        if add.get("size_bytes") is not None and info.size != add["size_bytes"]:
            report.problems.append(f"{where} has {info.size} bytes, its add action says "
                                   f"{add['size_bytes']}")
            continue
        try:
            with table.lake.fs.open_input_file(path) as f:
                parquet = pq.ParquetFile(f)
                count = parquet.metadata.num_rows
                columns = parquet.read(columns=[shard_col, entry_col])
        except (OSError, pa.ArrowException) as exc:
            report.problems.append(f"{where} does not read: {exc}")
            continue
        if add.get("num_records") is not None and count != add["num_records"]:
            report.problems.append(f"{where} has {count} rows, its add action says "
                                   f"{add['num_records']}")
        rows += count
        stream = str(add["partition.stream"])
        counts[(table.name, stream, origin.incarnations)] += count
        shards = columns.column(shard_col).to_numpy()
        values = columns.column(entry_col).to_numpy()
        for shard in np.unique(shards):
            entries[(stream, origin.incarnations, int(shard))].append(values[shards == shard])
    out = {"version": opened.version(), "files": len(adds), "rows": rows}
    if skipped:
        out["files_of_runs_not_committed"] = skipped
    return out


# ---- the ranges and the entries ---------------------------------------------------------------

def check_ranges(runs: list[RunRanges], report: CheckReport) -> None:
    """Per shipper and shard, each run starts where the one before ended."""
    by_app: dict[str, list[RunRanges]] = defaultdict(list)
    for r in runs:
        by_app[r.app].append(r)
    for app, app_runs in sorted(by_app.items()):
        app_runs.sort(key=lambda r: r.run)
        numbers = [r.run for r in app_runs]
        if len(set(numbers)) != len(numbers):
            report.problems.append(f"{app}: a run is committed twice ({numbers})")
        ends: dict[int, tuple[int, int]] = {}  # shard -> (end, run that ended there)
        for r in app_runs:
            for shard, (start, end) in sorted(r.ranges.items()):
                if start == end:
                    continue
                if shard in ends and start != ends[shard][0]:
                    prev_end, prev_run = ends[shard]
                    what = "a gap" if start > prev_end else "an overlap"
                    report.problems.append(
                        f"{app} shard {shard}: {what} between run {prev_run} (ends at entry "
                        f"{prev_end}) and run {r.run} (starts at entry {start})")
                ends[shard] = (end, r.run)
    by_stream: dict[tuple[str, Incarnation, int], list[tuple[int, int, str]]] = defaultdict(list)
    for r in runs:
        for shard, (a, b) in r.ranges.items():
            if a < b:
                by_stream[(r.stream, r.incarnation, shard)].append((a, b, r.app))
    for (stream, incarnation, shard), spans in sorted(by_stream.items(), key=str):
        spans.sort()
        for (a1, b1, app1), (a2, b2, app2) in zip(spans, spans[1:]):
            if a2 < b1 and app1 != app2:
                report.problems.append(
                    f"stream {stream!r} ({_inc(incarnation)}) shard {shard}: entries {a2}..{min(b1, b2) - 1} "
                    f"were shipped by two groups ({app1}, {app2})")


def check_entries(entries: dict[tuple[str, frozenset[Incarnation], int], list[np.ndarray]],
                  runs: list[RunRanges], report: CheckReport) -> None:
    """No entry twice within an incarnation, none outside the runs' ranges."""
    covered: dict[tuple[str, Incarnation, int], list[tuple[int, int]]] = defaultdict(list)
    known: dict[str, set[Incarnation]] = defaultdict(set)
    for r in runs:
        known[r.stream].add(r.incarnation)
        for shard, span in r.ranges.items():
            covered[(r.stream, r.incarnation, shard)].append(span)
    merged: dict[tuple[str, frozenset[Incarnation], int], list[np.ndarray]] = defaultdict(list)
    for (stream, incarnations, shard), arrays in entries.items():
        # a file of unknown origin (no run added it) may hold any incarnation's rows
        merged[(stream, incarnations or frozenset(known[stream]), shard)] += arrays
    for (stream, incarnations, shard), arrays in sorted(merged.items(), key=str):
        values = np.sort(np.concatenate(arrays))
        where = f"stream {stream!r} ({', '.join(_inc(i) for i in sorted(incarnations, key=str)) or 'no run'}) shard {shard}"
        if len(incarnations) <= 1:
            twice = np.unique(values[1:][values[1:] == values[:-1]])
            if len(twice):
                report.problems.append(f"{where}: entries committed twice: {_examples(twice)}")
        else:
            report.notes.append(f"{where}: rows of these incarnations share files (a compaction "
                                "merged them): their entries are checked against their ranges only")
        spans = sorted(s for i in incarnations for s in covered.get((stream, i, shard), []))
        outside = values[~_within(values, spans)]
        if len(outside):
            report.problems.append(f"{where}: committed entries outside every run's range: "
                                   f"{_examples(np.unique(outside))}")


def check_counts(counts: dict[tuple[str, str, frozenset[Incarnation]], int], runs: list[RunRanges],
                 report: CheckReport) -> None:
    """Per stream incarnation, the tables hold as many rows and rejects as its runs committed."""
    expected: dict[tuple[str, str, frozenset[Incarnation]], int] = defaultdict(int)
    for r in runs:
        expected[("main", r.stream, frozenset([r.incarnation]))] += r.rows
        expected[("rejects", r.stream, frozenset([r.incarnation]))] += r.rejects
    if any(len(key[2]) != 1 for key in counts):
        return  # rows of several incarnations (or of no run) share files: no count per incarnation
    for key in sorted(set(expected) | set(counts), key=str):
        name, stream, incarnations = key
        if expected[key] != counts[key]:
            what = "rows" if name == "main" else "rejects"
            report.problems.append(
                f"stream {stream!r} ({_inc(next(iter(incarnations)))}): its runs committed "
                f"{expected[key]} {what}, the {name} table has {counts[key]}")


def _within(values: np.ndarray, spans: list[tuple[int, int]]) -> np.ndarray:
    inside = np.zeros(len(values), dtype=bool)
    for start, end in spans:
        inside |= (values >= start) & (values < end)
    return inside


def read_offsets(data_dir: str, group: str) -> dict[str, tuple[int, dict[int, int | None]]]:
    """Per stream of the data directory: its incarnation, and per shard the
    group's offset (None: the group is not registered there).  Read-only."""
    from storage_c import Config, GroupNotFound, Log

    out: dict[str, tuple[int, dict[int, int | None]]] = {}
    with Log(data_dir, Config.inspector()) as storage:
        for stream in storage.streams():
            offsets: dict[int, int | None] = {}
            for shard in range(storage.shard_count(stream)):
                try:
                    offsets[shard] = storage.group(stream, shard, group, create=False).offset
                except GroupNotFound:
                    offsets[shard] = None
            out[stream] = (storage.stream_created_ns(stream), offsets)
    return out


def check_offsets(offsets: dict[str, tuple[int, dict[int, int | None]]], runs: list[RunRanges],
                  group: str, report: CheckReport) -> None:
    """The group's offset in each shard against the end of its last run."""
    ends: dict[tuple[str, int], int] = {}
    for r in sorted(runs, key=lambda r: r.run):
        if r.group != group:
            continue
        stream_offsets = offsets.get(r.stream)
        if stream_offsets is None or stream_offsets[0] != r.incarnation:
            continue
        for shard, (_, run_end) in r.ranges.items():
            ends[(r.stream, shard)] = run_end
    for stream, (incarnation, shard_offsets) in sorted(offsets.items()):
        shipped = {shard: end for (s, shard), end in ends.items() if s == stream}
        if not shipped:
            continue
        for shard, offset in sorted(shard_offsets.items()):
            end = shipped.get(shard)
            where = f"stream {stream!r} shard {shard}"
            if end is None or offset is None:
                report.notes.append(f"{where}: group {group!r} has {'no offset' if offset is None else offset}, "
                                    f"the lake {'no run' if end is None else f'runs up to entry {end}'}")
            elif offset > end:
                report.problems.append(
                    f"{where}: group {group!r} is acked up to entry {offset}, the lake's runs end at "
                    f"entry {end}: entries {end}..{offset - 1} are in no commit")
            elif offset < end:
                report.notes.append(
                    f"{where}: group {group!r} is at entry {offset}, the last run ends at {end}: that "
                    "run committed and has not acked yet (the next spark-ship acks it)")


def summary(runs: list[RunRanges], entries: dict[tuple[str, frozenset[Incarnation], int], list[np.ndarray]]
            ) -> list[dict[str, Any]]:
    out: dict[tuple[str, Incarnation], dict[str, Any]] = {}
    for r in sorted(runs, key=lambda r: (r.stream, str(r.incarnation), r.run)):
        s = out.setdefault((r.stream, r.incarnation), {"stream": r.stream, "incarnation": r.incarnation,
                                                       "runs": 0, "entries": 0, "ranges": {}})
        s["runs"] += 1
        for shard, (a, b) in r.ranges.items():
            if a == b:
                continue
            lo, hi = s["ranges"].get(str(shard), (a, b))
            s["ranges"][str(shard)] = (min(lo, a), max(hi, b))
    for (stream, incarnations, _), arrays in entries.items():
        if len(incarnations) == 1:
            key = (stream, next(iter(incarnations)))
            if key in out:
                out[key]["entries"] += int(sum(len(a) for a in arrays))
    return list(out.values())


def _examples(values: Iterable[Any]) -> str:
    items = [int(v) for v in values]
    shown = ", ".join(str(v) for v in items[:EXAMPLES])
    return shown + (f" and {len(items) - EXAMPLES} more" if len(items) > EXAMPLES else "")


def _inc(incarnation: Incarnation) -> str:
    return f"incarnation {incarnation}" if incarnation is not None else "an incarnation the data directory no longer has"


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
