"""``comet lake convert``: a format-1 lake (manifests) becomes the two Delta
tables in place.

What format 1 committed is what its manifests list (``legacy.py``); the
conversion adds exactly those files, and nothing else:

1. Every format-1 stream is read and checked first, before anything is
   written: its manifests, the files they list (each exists, has the size
   and the row count its manifest says; its ``_comet_`` columns give the
   statistics), one schema for all data files (a column with two types
   cannot be converted), and its incarnation in the data directory.
2. Reject files are rewritten: format 1 wrote ``stream`` both as a column
   and in the path, which Delta cannot declare (a partition column is no
   file column) and which readers of plain Parquet trip on.  They are small;
   the new files (``part-<run>-<task>-000-format1.zstd.parquet``) have the
   rejects table's columns, the ``error`` naming the entry as new rejects
   do.  The old files are then in no table: vacuum removes them.
3. One commit to the rejects table, then one to the main table, each with
   every shipper's app transaction (its last converted run), the
   conversion's own (``comet-lake-convert``, version 1) and what was
   converted as commit metadata (``comet.convert``).
4. The plan of each shipper's last run (``plan.py``), where the next
   ``comet spark-ship`` reads where to start: after the last manifest.
5. The format-1 metadata moves to ``_comet/format-1/<stream>/``: from then
   on the lake is no format-1 lake, and ``comet spark-ship`` ships into it.

A crash anywhere leaves the format-1 metadata in place until step 5, so the
lake is refused by ``comet spark-ship`` and converted again: a table whose
conversion transaction is there is not committed again; steps 2, 4 and 5
write the same names again.

A shipper's incarnation is its stream's creation time in the data
directory.  A stream the data directory no longer has, or has created
again after the lake's first run, is another incarnation: its rows are
converted, with no app transaction and no plan, and a stream of that name
is shipped from its start, as a new incarnation is.  A stream that is
missing is converted so only when the user says it is gone (``--gone``): a
wrong data directory must not make a lake ship everything again.

A run planned in format 1 that has no manifest (a crash interrupted it) is
not shipped: format 1 acked its group only after the manifest, so the next
run of the new version plans from the last manifest's ends and ships those
entries again; the files it left are in no manifest, and so in no table.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from comet.files import fsync_dir, make_dirs_durably, publish_durably
from comet.jsonlog import event

from .delta import LakeTable, main_schema, no_hooks, rejects_schema, storage_options, PARTITIONS
from .evolve import canonical, reserved, widen
from .history import CONVERT_KEY, OPERATION_KEY, commit_actions
from .lakefs import Lake
from .legacy import ARCHIVE_DIR, format_1_streams
from .plan import RunPlan, Shipper, struct_to_json, write_plan
from .writer import META_COLUMNS, PARQUET_OPTIONS, REJECT_SCHEMA, REJECTS_DIR, WrittenFile

if TYPE_CHECKING:
    from storage_c import Log

log = logging.getLogger("comet.lake")

CONVERT_APP = "comet-lake-convert"
"""The app transaction of the conversion's commits: version 1 once a table's is done."""
DEFAULT_GROUP = "spark-ship"
DEFAULT_ENTRIES_PER_TASK = 1_000_000
FORMAT_1_NAME = re.compile(r"^stream=(?P<stream>[^/]+)/dt=(?P<dt>\d{4}-\d\d-\d\d)/hour=(?P<hour>\d\d)/"
                           r"(?P<name>part-\d{8}-\d{5})\.zstd\.parquet$")
_META_NAMES = {f.name for f in META_COLUMNS}


class ConvertError(ValueError):
    """The lake cannot be converted as it is; the message says why and what to do."""


@dataclass
class StreamConversion:
    """One format-1 stream, read and checked."""

    stream: str
    group: str
    runs: list[int]
    last_ranges: dict[int, tuple[int, int]]
    segments: dict[int, list[tuple[int, int]]]
    data: list[WrittenFile] = field(default_factory=list)
    rejects: list[tuple[str, WrittenFile]] = field(default_factory=list)
    """(the format-1 file, relative to the lake root; the file it is rewritten to)."""
    rows: int = 0
    reject_rows: int = 0
    missing: int = 0
    incarnation: int | None = None
    gone: str | None = None
    """Why the stream's incarnation is not the data directory's (None: it is)."""
    not_shipped: list[int] = field(default_factory=list)
    last_plan: dict[str, Any] = field(default_factory=dict)

    @property
    def shipper(self) -> Shipper | None:
        return Shipper(self.stream, self.incarnation, self.group) if self.incarnation is not None else None

    def metadata(self) -> dict[str, Any]:
        shipper = self.shipper
        return {"incarnation": self.incarnation, "group": self.group,
                "app": shipper.app_id if shipper else None, "first_run": self.runs[0],
                "last_run": self.runs[-1], "runs": len(self.runs),
                "ranges": {str(s): [list(x) for x in seg] for s, seg in sorted(self.segments.items())},
                "last_ranges": {str(s): list(r) for s, r in sorted(self.last_ranges.items())},
                "rows": self.rows, "rejects": self.reject_rows, "missing": self.missing,
                "files": len(self.data) + len(self.rejects), "gone": self.gone,
                "not_shipped": self.not_shipped,
                "event_time_field": self.last_plan.get("event_time_field"),
                "event_time_unit": self.last_plan.get("event_time_unit") or "ms",
                "entries_per_task": self.last_plan.get("entries_per_task") or DEFAULT_ENTRIES_PER_TASK}


def convert(lake: Lake, data_dir: str | None, gone: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Converts the lake (or finishes a conversion a crash interrupted); what it did."""
    from .ship import crash_point

    lake.check()
    main, rejects = LakeTable.main(lake), LakeTable.rejects(lake)
    for table in (main, rejects):
        table.repair()
    streams = format_1_streams(lake)
    done = converted_metadata(main)
    if done is None:
        if not streams:
            raise ConvertError(f"{lake.url} is no format-1 lake: "
                               + ("it is a Delta lake already" if main.open() is not None else
                                  "it has no format-1 manifests (_comet/<stream>/manifests/)"))
        for table in (main, rejects):
            opened = table.open()
            if opened is not None and table.committed_run(CONVERT_APP, opened) < 1:
                raise ConvertError(f"{lake.url} has both format-1 manifests ({', '.join(streams)}) "
                                   f"and a Delta table ({table.uri}) that no conversion made: "
                                   "convert a copy of the format-1 lake without it")
        if data_dir is None:
            raise ConvertError("give --data-dir, the data directory the lake was shipped from: the "
                               "conversion records each stream's incarnation there, so that the "
                               "next comet spark-ship continues after the last manifest")
        conversions = read_streams(lake, streams, data_dir, gone)
        value_type = table_value_type(conversions)
        metadata = {c.stream: c.metadata() for c in conversions}
        txns = [(c.shipper.app_id, c.runs[-1]) for c in conversions if c.shipper is not None]
        reject_files = [new for c in conversions for _, new in c.rejects]
        if reject_files and rejects.committed_run(CONVERT_APP) < 1:
            for c in conversions:
                for old, new in c.rejects:
                    rewrite_reject(lake, old, new)
            commit(rejects, reject_files, rejects_schema(), txns, metadata)
        crash_point("convert-rejects-committed")
        commit(main, [f for c in conversions for f in c.data], main_schema(value_type), txns, metadata)
        crash_point("convert-committed")
        done = (metadata, struct_to_json(value_type))
        resumed = False
    else:
        resumed = True
        if not streams:
            raise ConvertError(f"{lake.url} is converted already: nothing to do")
        strangers = sorted(set(streams) - set(done[0]))
        if strangers:
            raise ConvertError(f"{lake.url} was converted, but has format-1 manifests of "
                               f"{', '.join(strangers)} that the conversion did not convert: "
                               "ship them into a lake of their own")
    metadata, value_schema = done
    rejects.ensure(rejects_schema())  # after the main commit: a redo must find no table but its own
    write_plans(lake, metadata, value_schema)
    crash_point("convert-planned")
    archived = [archive(lake, stream) for stream in streams]
    out = {"lake": lake.url, "resumed": resumed, "streams": metadata,
           "archived": archived, "tables": {t.name: _version(t) for t in (main, rejects)}}
    event(log, "converted", lake=lake.url, streams=sorted(metadata), resumed=resumed)
    return out


# ---- reading format 1 --------------------------------------------------------------------------

def read_streams(lake: Lake, streams: list[str], data_dir: str, gone: frozenset[str]) -> list[StreamConversion]:
    from storage_c import Config, Log

    with Log(data_dir, Config.inspector()) as storage:
        present = set(storage.streams())
        unknown = sorted(gone - set(streams))
        if unknown:
            raise ConvertError(f"--gone {', '.join(unknown)}: the lake has no format-1 stream of "
                               f"that name (it has {', '.join(streams)})")
        still_there = sorted(gone & present)
        if still_there:
            raise ConvertError(f"--gone {', '.join(still_there)}: {data_dir} has that stream")
        out = []
        for stream in streams:
            conversion = read_stream(lake, stream)
            if stream in present:
                place(conversion, storage, lake, data_dir)
            elif stream in gone:
                conversion.gone = f"not in {data_dir} (--gone)"
            else:
                raise ConvertError(
                    f"stream {stream!r} is not in {data_dir}: give the data directory the lake was "
                    f"shipped from, or, if the stream was deleted, --gone {stream} (its rows are "
                    "converted; a stream created again under that name is shipped from its start)")
            out.append(conversion)
    return out


def read_stream(lake: Lake, stream: str) -> StreamConversion:
    meta = f"_comet/{stream}"
    manifests = [read_doc(lake, f"{meta}/manifests/{name}") for name in _json_names(lake, f"{meta}/manifests")]
    manifests.sort(key=lambda m: int(m["run"]))
    plans = {int(name[:-5]): name for name in _json_names(lake, f"{meta}/plans")}
    runs = [int(m["run"]) for m in manifests]
    groups = sorted({str(m["group"]) for m in manifests})
    if len(groups) > 1:
        raise ConvertError(f"stream {stream!r}: the manifests name several groups ({', '.join(groups)}); "
                           "format 1 ships a stream with one group")
    last = manifests[-1]
    last_plan = read_doc(lake, f"{meta}/plans/{plans[runs[-1]]}") if runs[-1] in plans else {}
    c = StreamConversion(stream, groups[0], runs, _ranges(last, "manifest"), {},
                         not_shipped=sorted(r for r in plans if r not in set(runs)),
                         last_plan=last_plan)
    for m in manifests:
        for shard, (start, end) in sorted(_ranges(m, "manifest").items()):
            segments = c.segments.setdefault(shard, [])
            if start == end:
                continue
            if segments and segments[-1][1] == start:
                segments[-1] = (segments[-1][0], end)
            else:
                segments.append((start, end))
        c.missing += int(m.get("missing", 0))
        for f in m["files"]:
            read_file(lake, c, f, int(m["run"]))
    return c


def read_doc(lake: Lake, rel: str) -> dict[str, Any]:
    data = lake.read(rel)
    try:
        doc = json.loads(data) if data is not None else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or doc.get("version") != 1 or "run" not in doc:
        raise ConvertError(f"{lake.uri(rel)} is not a format-1 document (damaged?): restore it "
                           "from a backup before converting")
    return doc


def _json_names(lake: Lake, rel: str) -> list[str]:
    return [n for n in lake.list(rel) if n.endswith(".json") and n[:-5].isdigit()]


def _ranges(doc: dict[str, Any], what: str) -> dict[int, tuple[int, int]]:
    try:
        return {int(s): (int(a), int(b)) for s, (a, b) in doc["ranges"].items()}
    except (KeyError, TypeError, ValueError, AttributeError):
        raise ConvertError(f"run {doc.get('run')}'s {what} has no readable ranges (damaged?)") from None


def read_file(lake: Lake, c: StreamConversion, f: dict[str, Any], run: int) -> None:
    """Checks one listed file and describes it for the commit."""
    rel = str(f["path"])
    kind = str(f["kind"])
    in_table = rel[len(REJECTS_DIR) + 1:] if kind == "rejects" else rel
    match = FORMAT_1_NAME.match(in_table)
    if match is None or match["stream"] != c.stream or (kind == "rejects") != rel.startswith(f"{REJECTS_DIR}/"):
        raise ConvertError(f"run {run} of {c.stream!r} lists {rel}, which is not where format 1 "
                           "puts its files")
    where = f"{lake.uri(rel)} (run {run} of {c.stream!r})"
    info = lake.fs.get_file_info(lake.path(rel))
    if info.type.name == "NotFound":
        raise ConvertError(f"{where} is missing: the lake lost committed rows; restore the file "
                           "from a backup before converting")
    if info.size != int(f["bytes"]):
        raise ConvertError(f"{where} has {info.size} bytes, its manifest says {f['bytes']} (damaged?)")
    shard_col, entry_col, time_col = (("_comet_shard", "_comet_entry", "_comet_time") if kind == "data"
                                      else ("shard", "entry", "timestamp"))
    try:
        with lake.fs.open_input_file(lake.path(rel)) as handle:
            parquet = pq.ParquetFile(handle)
            schema = parquet.schema_arrow
            columns = parquet.read(columns=[shard_col, entry_col, time_col])
    except (OSError, pa.ArrowException, KeyError) as exc:
        raise ConvertError(f"{where} does not read: {exc}") from None
    if columns.num_rows != int(f["rows"]):
        raise ConvertError(f"{where} has {columns.num_rows} rows, its manifest says {f['rows']}")
    if not columns.num_rows:
        return  # no rows: nothing a reader would miss
    times = columns.column(time_col).cast(REJECT_SCHEMA.field("timestamp").type).cast(pa.int64())
    entries = columns.column(entry_col)
    import pyarrow.compute as pc

    t_lo, t_hi = (v.as_py() for v in pc.min_max(times).values())
    e_lo, e_hi = (v.as_py() for v in pc.min_max(entries).values())
    hour = _epoch_hour(match["dt"], int(match["hour"]))
    if kind == "data":
        value_type = pa.struct([pa.field(x.name, canonical(x.type)) for x in schema
                                if x.name not in _META_NAMES])
        c.data.append(WrittenFile("data", rel, 0, hour, columns.num_rows, info.size, int(f["shard"]),
                                  e_lo, e_hi, t_lo, t_hi, value_type))
        c.rows += columns.num_rows
    else:
        new = posixpath.join(posixpath.dirname(in_table), f"{match['name']}-000-format1.zstd.parquet")
        c.rejects.append((rel, WrittenFile("rejects", new, 0, hour, columns.num_rows, 0, int(f["shard"]),
                                           e_lo, e_hi, t_lo, t_hi)))
        c.reject_rows += columns.num_rows


def _epoch_hour(dt: str, hour: int) -> int:
    day = datetime.strptime(dt, "%Y-%m-%d").replace(tzinfo=timezone.utc)
    return int(day.timestamp()) // 3600 + hour


def place(c: StreamConversion, storage: Log, lake: Lake, data_dir: str) -> None:
    """The stream's incarnation: the data directory's, unless it was created
    after the lake's first run (deleted and created again)."""
    created_ns = storage.stream_created_ns(c.stream)
    first = _first_written(lake, c)
    if created_ns > first * 1e9:
        c.gone = (f"{data_dir} has {c.stream!r} created again after the lake's first run (created "
                  f"{_iso(created_ns / 1e9)}, first run {_iso(first)})")
        return
    count = storage.shard_count(c.stream)
    for shard, segments in sorted(c.segments.items()):
        end = segments[-1][1] if segments else 0
        if shard >= count or storage.shard_stats(c.stream, shard).next_entry < end:
            raise ConvertError(f"stream {c.stream!r} shard {shard}: the lake holds entries up to "
                               f"{end}, which {data_dir} never had: is it the data directory the lake "
                               "was shipped from?")
    c.incarnation = created_ns


def _first_written(lake: Lake, c: StreamConversion) -> float:
    """When the stream's first run was planned (its plan's ``created``; else its manifest's)."""
    meta = f"_comet/{c.stream}"
    for rel in (f"{meta}/plans/{c.runs[0]:08d}.json", f"{meta}/manifests/{c.runs[0]:08d}.json"):
        data = lake.read(rel)
        if data is not None:
            try:
                return float(json.loads(data)["created"])
            except (ValueError, KeyError, TypeError):
                continue
    raise ConvertError(f"stream {c.stream!r}: neither the plan nor the manifest of run {c.runs[0]} "
                       "says when it was made")


def table_value_type(conversions: list[StreamConversion]) -> pa.StructType:
    """One value type for every data file: a column keeps one type (structs
    may gain children from one run to the next); else the lake cannot be
    converted."""
    from deltalake import Schema

    merged: dict[str, pa.DataType] = {}
    first_seen: dict[str, str] = {}
    for c in conversions:
        for f in c.data:
            assert f.value_type is not None
            for x in f.value_type:
                if reserved(x.name):
                    raise ConvertError(f"{f.path}: value column {x.name!r} has the name of one of the "
                                       "lake's own columns")
                if x.name not in merged:
                    merged[x.name], first_seen[x.name] = x.type, f.path
                    continue
                # files keep their physical types: a long column is not read as double
                both = widen(merged[x.name], x.type, numbers=False)
                if both is None:
                    raise ConvertError(
                        f"column {x.name!r} is {merged[x.name]} in {first_seen[x.name]} and {x.type} in "
                        f"{f.path}: a Delta column has one type; rewrite one of them with the other "
                        "type (or drop the column from it) before converting")
                merged[x.name] = both
    value_type = pa.struct([pa.field(n, t) for n, t in merged.items()])
    try:
        Schema.from_arrow(main_schema(value_type))
    except Exception as exc:  # delta-rs says which type it cannot hold
        raise ConvertError(f"the lake's columns cannot be a Delta schema: {exc}") from None
    return value_type


# ---- writing -----------------------------------------------------------------------------------

def rewrite_reject(lake: Lake, old_rel: str, new: WrittenFile) -> None:
    """A format-1 reject file as the rejects table's file ``new``: without
    the ``stream`` column, its error naming the entry (as a run's do)."""
    with lake.fs.open_input_file(lake.path(old_rel)) as handle:
        old = pq.read_table(handle)
    shards, entries = old.column("shard"), old.column("entry")
    errors = [f"shard {s} entry {e}: {why or ''}" for s, e, why in
              zip(shards.to_pylist(), entries.to_pylist(), old.column("error").to_pylist())]
    table = pa.table([shards.cast(pa.int32()), entries.cast(pa.int64()),
                      old.column("timestamp").cast(REJECT_SCHEMA.field("timestamp").type),
                      old.column("value").cast(pa.binary()), pa.array(errors, pa.string())],
                     schema=REJECT_SCHEMA)
    final = lake.path(REJECTS_DIR, new.path)
    if lake.is_s3:
        pq.write_table(table, final, filesystem=lake.fs, **PARQUET_OPTIONS)
    else:
        temp = lake.path("_comet/tmp/convert", posixpath.basename(new.path) + f".{os.getpid()}.tmp")
        os.makedirs(posixpath.dirname(temp), exist_ok=True)
        pq.write_table(table, temp, **PARQUET_OPTIONS)
        make_dirs_durably(posixpath.dirname(final), lake.root)
        publish_durably(temp, final)
    new.bytes = lake.fs.get_file_info(final).size


def commit(table: LakeTable, files: list[WrittenFile], schema: pa.Schema,
           txns: list[tuple[str, int]], metadata: dict[str, Any]) -> int | None:
    """Creates ``table`` with ``files`` in one commit (None: the conversion's
    commit is there already)."""
    from deltalake import CommitProperties, Schema, Transaction
    from deltalake.transaction import create_table_with_add_actions

    if table.committed_run(CONVERT_APP) >= 1:
        return None
    props = CommitProperties(custom_metadata={OPERATION_KEY: "convert",
                                              CONVERT_KEY: json.dumps(metadata, separators=(",", ":"))},
                             app_transactions=[Transaction(CONVERT_APP, 1)]
                             + [Transaction(app, run) for app, run in txns])
    if not table.lake.is_s3:
        make_dirs_durably(table.root, table.lake.root)
    create_table_with_add_actions(table.uri, Schema.from_arrow(schema),
                                  [table.add_action(f) for f in files], mode="error",
                                  partition_by=PARTITIONS, storage_options=storage_options(table.lake),
                                  commit_properties=props, post_commithook_properties=no_hooks())
    return table.after_commit(-1)


def converted_metadata(main: LakeTable) -> tuple[dict[str, Any], str] | None:
    """What the main table's conversion commit says it converted, and the
    value schema (None: no conversion has committed there)."""
    opened = main.open()
    if opened is None or main.committed_run(CONVERT_APP, opened) < 1:
        return None
    for version in range(opened.version() + 1):
        actions = commit_actions(main, version) or []
        info: dict[str, Any] = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        if CONVERT_KEY in info:
            at = main.open(version)  # the value columns as the conversion made them
            assert at is not None
            return json.loads(info[CONVERT_KEY]), struct_to_json(main.value_type(at))
    raise ConvertError(f"{main.uri} has the conversion's transaction but no commit says what it "
                       "converted (its log was cleaned up?)")


def write_plans(lake: Lake, metadata: dict[str, Any], value_schema: str) -> None:
    """The plan of each shipper's last converted run, as a run of this version writes it."""
    for stream, meta in sorted(metadata.items()):
        if meta.get("incarnation") is None:
            continue
        plan = RunPlan(int(meta["last_run"]), stream, int(meta["incarnation"]), str(meta["group"]),
                       {int(s): (int(a), int(b)) for s, (a, b) in meta["last_ranges"].items()},
                       value_schema, True, int(meta["entries_per_task"]), meta.get("event_time_field"),
                       str(meta.get("event_time_unit") or "ms"), resolved=True)
        write_plan(lake, plan)


def archive(lake: Lake, stream: str) -> str:
    """Moves ``_comet/<stream>/`` to ``_comet/format-1/<stream>/``; the new place.
    On S3 every object is copied first, then removed, the manifests last (a
    crash in between leaves the stream format 1, and converting again
    finishes the move)."""
    import pyarrow.fs as pafs

    src, dst = f"_comet/{stream}", f"{ARCHIVE_DIR}/{stream}"
    if not lake.is_s3:
        make_dirs_durably(lake.path(ARCHIVE_DIR), lake.root)
        if os.path.exists(lake.path(dst)):
            raise ConvertError(f"{lake.uri(dst)} exists already: move it away, then convert again")
        os.rename(lake.path(src), lake.path(dst))
        fsync_dir(lake.path("_comet"))
        fsync_dir(lake.path(ARCHIVE_DIR))
        return dst
    selector = pafs.FileSelector(lake.path(src), recursive=True, allow_not_found=True)
    objects = [i.path for i in lake.fs.get_file_info(selector) if i.type == pafs.FileType.File]
    for path in objects:
        lake.fs.copy_file(path, lake.path(dst) + path[len(lake.path(src)):])
    for path in sorted(objects, key=lambda p: "/manifests/" in p):
        lake.fs.delete_file(path)
    return dst


def _version(table: LakeTable) -> int | None:
    opened = table.open()
    return opened.version() if opened is not None else None


def _iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))
