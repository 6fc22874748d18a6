"""``comet spark-ship``: a stream into a partitioned Parquet lake, exactly once.

    report = ship(spark, ShipOptions("./data", "events", Lake("s3://bucket/lake")))

One call is one run (see ``plan.py`` for the protocol): finish what a
crashed run left, or plan a new run from the group's offsets to the
committed ends, read it through the ``comet`` source with the values
parsed by pyarrow in the source, write Parquet through ``writer.WriteTask``,
publish, write the manifest, ack.  Under spark-submit: ``submit.py``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from storage_c import Config, Log, check_group_name
from storage_c.files import fsync_dir, pid_alive

from .lakefs import Lake
from .offsets import Offsets, shard_list, SourceOptions, bounds, to_json
from .plan import (
    Manifest,
    RunPlan,
    ShippedFile,
    manifest_rel,
    manifest_runs,
    meta_dir,
    plan_rel,
    plan_runs,
    read_manifest,
    read_plan,
    staging_rel,
)
from .source import cap, split
from .writer import ShipTask

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("comet.spark_ship")

DEFAULT_GROUP = "spark-ship"
DEFAULT_SAMPLE = 1000
DEFAULT_ENTRIES_PER_TASK = 1_000_000
RESERVED_PREFIX = "_comet_"
EVENT_TIME_UNITS = ("s", "ms", "us", "ns")


@dataclass
class ShipOptions:
    data_dir: str
    stream: str
    lake: Lake
    group: str = DEFAULT_GROUP
    value_schema: str | None = None
    """Spark DDL of the values (``"device string, temp double"``); None: the
    lake's schema so far, or inferred from a sample on the first run."""
    sample: int = DEFAULT_SAMPLE
    event_time_field: str | None = None
    event_time_unit: str = "ms"
    max_entries: int | None = None
    entries_per_task: int = DEFAULT_ENTRIES_PER_TASK


@dataclass
class ShipReport:
    run: int | None
    """The last run done (None: there was nothing to ship)."""
    resumed: int | None = None
    """A run a crash had interrupted, finished first."""
    rows: int = 0
    rejects: int = 0
    missing: int = 0
    files: int = 0
    seconds: float = 0.0
    acked: dict[int, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "resumed": self.resumed, "rows": self.rows,
                "rejects": self.rejects, "missing": self.missing, "files": self.files,
                "seconds": round(self.seconds, 3), "acked": to_json(self.acked)}


def ship(spark: Any, opts: ShipOptions) -> ShipReport:
    """Removes what killed runs left (``remove_leftovers``), finishes a run a
    crash interrupted, if any, then ships what is new in one more run."""
    t0 = time.monotonic()
    check_group_name(opts.group)
    if opts.event_time_unit not in EVENT_TIME_UNITS:
        raise ValueError(f"event time unit {opts.event_time_unit!r}: use one of {EVENT_TIME_UNITS}")
    if opts.value_schema:
        check_schema(spark, opts.value_schema, opts)
    lake = opts.lake
    lake.check()
    remove_leftovers(lake, opts.stream)
    report = ShipReport(None)
    # A reader: the run registers its group and acks it, like any consumer,
    # with the flusher that makes the acks durable.
    with Log(opts.data_dir, Config.reader()) as storage:
        shards = shard_list(storage, SourceOptions(opts.data_dir, opts.stream))
        while True:
            plan, resumed = _plan(spark, storage, lake, opts, shards)
            if plan is None:
                break
            log.info(json.dumps({"event": "run_start", "run": plan.run, "resumed": resumed,
                                 "entries": plan.entries}))
            manifest = _execute(spark, lake, opts, plan)
            report.acked.update(_ack(storage, plan.stream, plan.group, plan.ranges))
            report.run = plan.run
            report.rows += manifest.rows
            report.rejects += manifest.rejects
            report.missing += manifest.missing
            report.files += len(manifest.files)
            if not resumed:
                break
            report.resumed = plan.run
    report.seconds = time.monotonic() - t0
    log.info(json.dumps({"event": "done", **report.to_dict()}))
    return report


# ---- what killed runs left ---------------------------------------------------------------

STALE_TEMP_S = 3600.0
"""A plan's or manifest's temporary file older than this is stale whoever
wrote it: its writer renames it within milliseconds (an fsync)."""
_DOCUMENT_TEMP = re.compile(r"^\.\d{8}\.json\.(\d+)\.tmp$")


def remove_leftovers(lake: Lake, stream: str) -> dict[str, object]:
    """Removes what killed runs left and no rerun rewrites, before a run starts.

    - Temporary files of plans and manifests (``.<run>.json.<pid>.tmp``, local
      lakes only: S3 PUTs have none) whose writer is dead: its pid is no live
      process here (this machine, this PID namespace: the driver wrote them),
      or the file is older than ``STALE_TEMP_S``.
      spark-ship holds no lock on the lake, so a file of a live writer (another
      run, against the rule of one run per lake and stream) is kept.
    - The staging directories of runs that have a manifest: after its commit
      point nobody writes there (files a killed task or an executor that
      outlived its driver put there, or a crash before the run removed it).

    The staging directory of a run without a manifest is not touched here: that
    run is redone next, and its redo starts by removing it whole."""
    temp_files = []
    if not lake.is_s3:
        for folder in ("plans", "manifests"):
            directory = lake.path(meta_dir(stream), folder)
            try:
                names = os.listdir(directory)
            except FileNotFoundError:
                continue
            for name in names:
                match = _DOCUMENT_TEMP.match(name)
                path = os.path.join(directory, name)
                if match and _stale_temp(path, int(match.group(1))):
                    try:
                        os.unlink(path)
                    except FileNotFoundError:
                        continue
                    temp_files.append(f"{meta_dir(stream)}/{folder}/{name}")
    published = set(manifest_runs(lake, stream))
    staged = [int(name) for name in lake.list_dirs(f"{meta_dir(stream)}/staging")
              if name.isdigit() and int(name) in published]
    for run in staged:
        lake.delete_tree(staging_rel(stream, run))
    out: dict[str, object] = {"temp_files": temp_files, "staging_runs": staged}
    if temp_files or staged:
        log.info(json.dumps({"event": "removed_leftovers", "stream": stream, **out}))
    return out


def _stale_temp(path: str, pid: int) -> bool:
    try:
        age = time.time() - os.stat(path).st_mtime
    except FileNotFoundError:
        return False
    return age > STALE_TEMP_S or (pid != os.getpid() and not pid_alive(pid))


# ---- planning ---------------------------------------------------------------------------

def _plan(spark: Any, storage: Log, lake: Lake, opts: ShipOptions,
          shards: list[int]) -> tuple[RunPlan | None, bool]:
    """The run to do: a planned one without a manifest, or a new one."""
    planned = plan_runs(lake, opts.stream)
    published = manifest_runs(lake, opts.stream)
    pending = [r for r in planned if r not in set(published)]
    if pending:
        plan = read_plan(lake, opts.stream, pending[-1])
        if plan.group != opts.group:
            raise ValueError(f"run {plan.run} of {opts.stream!r} in {lake.url} was planned for "
                             f"group {plan.group!r}, not {opts.group!r}: finish it with that group")
        return plan, True
    done: Offsets = {}
    known_ddl = None
    if published:
        last = read_manifest(lake, opts.stream, published[-1])
        if last.group != opts.group:
            raise ValueError(f"the lake {lake.url} is shipped by group {last.group!r}, "
                             f"not {opts.group!r}")
        _ack(storage, last.stream, last.group, last.ranges)  # a crash may have come before it
        done = {s: end for s, (_, end) in last.ranges.items()}
        known_ddl = last.value_ddl  # the lake keeps one schema unless told otherwise
    starts: Offsets = {}
    ends: Offsets = {}
    for shard in shards:
        group = storage.group(opts.stream, shard, opts.group)  # registered: retention keeps its data
        starts[shard] = max(group.offset, done.get(shard, 0))
        ends[shard] = max(durable_end(storage, opts.stream, shard), starts[shard])
    ends = cap(starts, ends, opts.max_entries)
    if all(starts[s] >= ends[s] for s in shards):
        return None, False
    ddl = (opts.value_schema or known_ddl
           or infer_schema(spark, storage, opts.stream, starts, ends, opts.sample))
    check_schema(spark, ddl, opts)
    run = (max(planned) if planned else 0) + 1
    plan = RunPlan(run, opts.stream, opts.group, {s: (starts[s], ends[s]) for s in shards},
                   ddl, opts.entries_per_task, opts.event_time_field, opts.event_time_unit)
    lake.write_atomically(plan_rel(opts.stream, run), plan.to_json())
    crash_point("planned")
    return plan, False


def durable_end(storage: Log, stream: str, shard: int) -> int:
    """The shard's committed end, once every entry before it is durable: a plan
    (and so a manifest) never names entries a power cut can take back - the
    log would give their numbers to new entries, which the next run, starting
    after the manifest, would never ship."""
    end = bounds(storage, stream, shard)[1]
    if storage.shard_stats(stream, shard).durable_entry < end:
        storage.sync(stream, shard)  # up to the committed end at least
    return end


def struct_of(spark: Any, ddl: str) -> Any:
    from pyspark.sql.types import StructType, _parse_datatype_string

    try:
        parsed = _parse_datatype_string(ddl)
    except Exception as exc:
        raise ValueError(f"value schema {ddl!r} is not valid Spark DDL: {spark_reason(exc)}") from None
    if not isinstance(parsed, StructType):
        raise ValueError(f"value schema {ddl!r}: give fields, like 'device string, temp double'")
    return parsed


def spark_reason(exc: BaseException) -> str:
    """Spark's own message in one line: a ParseException's text starts with
    an empty line and goes on with the DDL and a caret under the fault; a
    Py4J error carries the JVM's stack trace.  The first line with words is
    the reason (``[PARSE_SYNTAX_ERROR] Syntax error at or near 'g'. SQLSTATE:
    42601 (line 1, pos 7)``)."""
    for line in str(exc).splitlines():
        line = line.strip()
        if line:
            return line
    return type(exc).__name__


def check_schema(spark: Any, ddl: str, opts: ShipOptions) -> None:
    from pyspark.sql.types import NumericType, TimestampType

    struct = struct_of(spark, ddl)
    for f in struct.fields:
        if f.name.startswith(RESERVED_PREFIX):
            raise ValueError(f"value field {f.name!r}: names starting with {RESERVED_PREFIX} "
                             "are the lake's own columns")
    if opts.event_time_field:
        if opts.event_time_field not in struct.fieldNames():
            raise ValueError(f"event time field {opts.event_time_field!r} is not in the value "
                             f"schema ({', '.join(struct.fieldNames())})")
        kind = struct[opts.event_time_field].dataType
        if not isinstance(kind, (TimestampType, NumericType)):
            raise ValueError(f"event time field {opts.event_time_field!r} is {kind.simpleString()}: "
                             "give it as timestamp (ISO 8601 text) or a number "
                             "(epoch, see --event-time-unit) in the schema")


def infer_schema(spark: Any, storage: Log, stream: str, starts: Offsets, ends: Offsets,
                 sample: int) -> str:
    """Spark's JSON inference over up to ``sample`` entries, spread over shards."""
    import orjson

    lines: list[str] = []
    live = [s for s in starts if starts[s] < ends[s]]
    per_shard = max(1, sample // max(1, len(live)))
    for shard in live:
        got = storage.read(stream, shard, starts[shard], min(per_shard, ends[shard] - starts[shard]))
        for payload in got.payloads:
            try:
                if isinstance(orjson.loads(payload), dict):
                    lines.append(payload.decode("utf-8", "replace"))
            except orjson.JSONDecodeError:
                continue
    if not lines:
        raise ValueError(f"cannot infer a schema: no JSON object among the first entries of "
                         f"{stream!r}; give one with --schema")
    inferred = spark.read.json(spark.sparkContext.parallelize(lines, 1)).schema
    fields = [f for f in inferred.fields if f.name != "_corrupt_record"]
    return ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in fields)


# ---- running ----------------------------------------------------------------------------

def crash_point(name: str) -> None:
    """Fault injection for the crash tests: ``COMET_SPARK_SHIP_CRASH=<name>``
    kills this process with SIGKILL at that point of a run."""
    if os.environ.get("COMET_SPARK_SHIP_CRASH") == name:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


def _execute(spark: Any, lake: Lake, opts: ShipOptions, plan: RunPlan) -> Manifest:
    from pyspark.sql.pandas.types import to_arrow_type

    staging = staging_rel(plan.stream, plan.run)
    lake.delete_tree(staging)  # what a crashed attempt left is rewritten whole
    live = {s: r for s, r in plan.ranges.items() if r[0] < r[1]}
    value_type = cast("pa.StructType", to_arrow_type(struct_of(spark, plan.value_ddl), timezone="UTC"))
    starts = {s: a for s, (a, _) in live.items()}
    ends = {s: b for s, (_, b) in live.items()}
    tasks = list(enumerate(split(starts, ends, plan.entries_per_task)))
    job = ShipTask(os.path.abspath(opts.data_dir), lake, plan.stream, plan.run, value_type,
                   plan.event_time_field, plan.event_time_unit)
    # As many Spark partitions as cores, each taking its tasks in turn: a
    # Spark task costs ~0.1 s to schedule, a plan's task numbers stay the same.
    slices = min(len(tasks), max(1, spark.sparkContext.defaultParallelism))
    rows = (spark.sparkContext.parallelize(tasks, slices).mapPartitions(job).collect()
            if tasks else [])
    files = sorted((ShippedFile(**r) for r in rows), key=lambda f: f.path)
    crash_point("written")
    _publish(lake, staging, files)
    crash_point("published")
    data_rows = sum(f.rows for f in files if f.kind == "data")
    rejects = sum(f.rows for f in files if f.kind == "rejects")
    manifest = Manifest(plan.run, plan.stream, plan.group, plan.ranges, files, data_rows, rejects,
                        plan.entries - data_rows - rejects, plan.value_ddl)
    lake.write_atomically(manifest_rel(plan.stream, plan.run), manifest.to_json())
    crash_point("manifested")
    lake.delete_tree(staging)
    return manifest


def _publish(lake: Lake, staging: str, files: list[ShippedFile]) -> None:
    """Moves every staged file to its final name; locally, the directories
    are synced before the manifest names them."""
    for i, f in enumerate(files):
        if i == len(files) // 2:
            crash_point("publishing")
        lake.move(f"{staging}/{f.path}", f.path)
    if not lake.is_s3:
        for directory in sorted({os.path.dirname(lake.path(f.path)) for f in files}):
            fsync_dir(directory)


def _ack(storage: Log, stream: str, group: str, ranges: dict[int, tuple[int, int]]) -> dict[int, int]:
    out = {}
    for shard, (start, end) in sorted(ranges.items()):
        if shard == max(ranges):
            crash_point("acking")
        g = storage.group(stream, shard, group)
        out[shard] = g.ack(end - 1) if end > start else g.offset
    return out
