"""``comet spark-ship``: a stream into a Delta Lake table, exactly once.

    report = ship(ShipOptions("./data", "events", Lake("s3://bucket/lake")), spark_session)

One call is one run (the protocol: ``lake/LAKE.md``): finish a run a crash
interrupted, or plan a new one from the group's offsets to the committed
ends; read, parse and write each range's Parquet in a Spark task
(``writer.ShipTask``); settle the schema; commit the files to the Delta
tables with the run's app transaction (``lake/delta.py``); ack the group.
Under spark-submit: ``submit.py``.

Spark is started last, and only for work: every check that needs no JVM
(the options, the lake, the stream, the group, what is new, the shipper's
lock) comes first, and a run with nothing to ship never starts it.  The
lock (``lake/lock``): a second run of the same stream and group at the same
time is refused at once and changes nothing.  A given value schema is
checked by Spark's parser as soon as the session is up, before any job.
The OTLP streams have built-in schemas (``otlp_schema.py``), which need
no JVM.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa

from comet.files import remove_stale_temp_files
from comet.jsonlog import event
from storage_c import Config, GroupNotFound, Log, check_group_name
from storage_c.testing import cut_point

from ..lake.delta import COMMIT_ATTEMPTS, LakeTable, SchemaConflict, main_schema, ranges_text, rejects_schema
from ..lake.evolve import fits, resolve, type_name
from ..lake.lakefs import Lake
from ..lake.layout import REJECTS_DIR, WrittenFile
from ..lake.lock import LakeBusy, run_lock
from ..lake.plan import RunPlan, Shipper, plan_runs, read_plan, remove_old_plans, struct_to_json, write_plan
from . import otlp_schema
from .offsets import Offsets, SourceOptions, bounds, cap, shard_list, to_json
from .schema import check_value_type, given_value_type, sample_value_type, value_ddl

log = logging.getLogger("comet.spark_ship")

DEFAULT_GROUP = "spark-ship"
DEFAULT_SAMPLE = 1000
DEFAULT_ENTRIES_PER_TASK = 1_000_000
EVENT_TIME_UNITS = ("s", "ms", "us", "ns")


@dataclass
class ShipOptions:
    data_dir: str
    stream: str
    lake: Lake
    group: str = DEFAULT_GROUP
    value_schema: str | None = None
    """Spark DDL of the values (``"device string, temp double"``) or a
    StructType's JSON: the fields stored, no others; None: the lake's
    columns, grown by the new fields of the data."""
    sample: int = DEFAULT_SAMPLE
    event_time_field: str | None = None
    event_time_unit: str = "ms"
    max_entries: int | None = None
    entries_per_task: int = DEFAULT_ENTRIES_PER_TASK
    otlp: str | None = None
    """The stream holds the gateway's OTLP events of this signal (``logs``,
    ``traces``, ``metrics``): ship them with its built-in schema
    (``otlp_schema.py``).  Without it and without ``value_schema``, the
    streams ``otel-logs``, ``otel-traces``, ``otel-metrics`` are shipped so."""

    @property
    def signal(self) -> str | None:
        """The OTLP signal whose schema the run ships with (None: none)."""
        return otlp_schema.signal_of(self.stream, self.otlp, self.value_schema)


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
    new_columns: list[str] = field(default_factory=list)
    commit_seconds: float = 0.0
    """The Delta commits' own time."""
    seconds: float = 0.0
    """Wall time of the whole call, Spark's start included."""
    acked: dict[int, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "resumed": self.resumed, "rows": self.rows,
                "rejects": self.rejects, "missing": self.missing, "files": self.files,
                "new_columns": self.new_columns, "commit_seconds": round(self.commit_seconds, 3),
                "seconds": round(self.seconds, 3), "acked": to_json(self.acked)}


@dataclass
class LakeState:
    """Where the lake stands for a shipper, read without Spark."""

    committed: int = 0
    """The shipper's last committed run (0: none)."""
    pending: RunPlan | None = None
    """A planned run that has not committed: a crash interrupted it."""
    done: Offsets = field(default_factory=dict)
    """Per shard, the end of the last committed run."""
    new_entries: bool = False
    """Entries past the group's offsets (and ``done``) in some shard."""


@dataclass
class RunOutcome:
    files: list[WrittenFile]
    rows: int
    rejects: int
    new_columns: list[str]
    commit_seconds: float


def ship(opts: ShipOptions, spark: Callable[[], Any]) -> ShipReport:
    """Finishes a run a crash interrupted, if any, then ships what is new in
    one more run.  ``spark()`` gives the Spark session: it is called once,
    and only when there is work for Spark."""
    t0 = time.monotonic()
    check_group_name(opts.group)
    if opts.event_time_unit not in EVENT_TIME_UNITS:
        raise ValueError(f"event time unit {opts.event_time_unit!r}: use one of {EVENT_TIME_UNITS}")
    given_ddl = value_ddl(opts.value_schema) if opts.value_schema else None
    signal = opts.signal  # a wrong one fails here, before anything else
    lake = opts.lake
    lake.check()
    report = ShipReport(None)
    # A reader: the run registers its group and acks it, like any consumer,
    # with the flusher that makes the acks durable.
    with Log(opts.data_dir, Config.reader()) as storage:
        shards = shard_list(storage, SourceOptions(opts.data_dir, opts.stream))
        shipper = Shipper(opts.stream, storage.stream_created_ns(opts.stream), opts.group)
        for table in (LakeTable.main(lake), LakeTable.rejects(lake)):
            table.repair()  # before anything reads the table's log
        state = lake_state(storage, lake, shipper, shards)
        if state.pending is None and not state.new_entries:
            register_group(storage, opts, shards)  # retention keeps its data from now on
        else:
            with run_lock(lake, opts.stream, opts.group):
                session = spark()
                given = given_value_type(given_ddl) if given_ddl else None
                if signal is not None:
                    given = otlp_schema.value_type(signal)  # no JVM needed
                if given is not None:
                    check_value_type(given, opts.event_time_field)
                remove_leftovers(lake, shipper)
                _runs(session, storage, opts, shipper, shards, given, report)
    report.seconds = time.monotonic() - t0
    event(log, "done", **report.to_dict())
    return report


def _runs(session: Any, storage: Log, opts: ShipOptions, shipper: Shipper, shards: list[int],
          given: pa.StructType | None, report: ShipReport) -> None:
    """Under the lock: the interrupted run (if any), then one new run."""
    while True:
        state = lake_state(storage, opts.lake, shipper, shards)  # as it is now, under the lock
        plan, resumed = state.pending, True
        if plan is None:
            plan, resumed = _plan(storage, opts, shipper, shards, state, given), False
        if plan is None:
            return
        event(log, "run_start", run=plan.run, resumed=resumed, entries=plan.entries)
        outcome = _execute(session, opts, plan)
        report.acked.update(_ack(storage, plan.stream, plan.group, plan.ranges))
        remove_old_plans(opts.lake, shipper, plan.run)
        report.run = plan.run
        report.rows += outcome.rows
        report.rejects += outcome.rejects
        report.missing += plan.entries - outcome.rows - outcome.rejects
        report.files += len(outcome.files)
        report.new_columns += outcome.new_columns
        report.commit_seconds += outcome.commit_seconds
        if not resumed:
            return
        report.resumed = plan.run


# ---- what killed runs left ---------------------------------------------------------------

def temp_rel(shipper: Shipper) -> str:
    """Where a local lake's tasks write files before renaming them into the table."""
    return f"_comet/tmp/{shipper.stream}/{shipper.group}"


def remove_leftovers(lake: Lake, shipper: Shipper) -> dict[str, object]:
    """Removes what killed runs of this shipper left, under its lock (no run
    of it writes now): the tasks' temporary files, and temporary files of
    plans whose writer is dead (``comet.files.remove_stale_temp_files``).
    Parquet files a crashed attempt wrote under their final names are in no
    commit: no reader sees them, and ``comet lake vacuum`` removes them."""
    temp_files: list[str] = []
    if not lake.is_s3:
        tmp = Path(lake.path(temp_rel(shipper)))
        if tmp.is_dir():
            temp_files += [str(p.relative_to(lake.root)) for p in sorted(tmp.rglob("*")) if p.is_file()]
            lake.delete_tree(temp_rel(shipper))
        plans = Path(lake.path(shipper.plans_dir))
        temp_files += [str(p.relative_to(lake.root)) for p in remove_stale_temp_files(plans)]
    if temp_files:
        event(log, "removed_leftovers", stream=shipper.stream, temp_files=temp_files)
    return {"temp_files": temp_files}


# ---- planning ---------------------------------------------------------------------------

def lake_state(storage: Log, lake: Lake, shipper: Shipper, shards: list[int]) -> LakeState:
    """The shipper's state in the lake, and whether anything is new: no
    Spark, and no group registered (a run that fails later leaves none).
    Redoes the last committed run's acks if a crash came before them."""
    committed = LakeTable.main(lake).committed_run(shipper.app_id)
    state = LakeState(committed)
    planned = plan_runs(lake, shipper)
    if planned and planned[-1] > committed:
        state.pending = read_plan(lake, shipper, planned[-1])
        return state
    if committed:
        last = read_plan(lake, shipper, committed)
        if last is None:
            raise ValueError(f"the lake {lake.url} has run {committed} of {shipper.app_id} "
                             f"committed, but not its plan {shipper.plan_rel(committed)}, which "
                             "says where the next run starts: restore it, or ship this stream "
                             "with another group")
        if acks_behind(storage, shipper, last.ranges):
            _ack(storage, shipper.stream, shipper.group, last.ranges)
        state.done = last.ends
    for shard in shards:
        first, end = bounds(storage, shipper.stream, shard)
        try:
            offset = storage.group(shipper.stream, shard, shipper.group, create=False).offset
        except GroupNotFound:
            offset = first  # where registering it would put it
        if max(offset, state.done.get(shard, 0)) < end:
            state.new_entries = True
    return state


def register_group(storage: Log, opts: ShipOptions, shards: list[int]) -> dict[int, int]:
    """Registers the run's group in every shard (retention keeps what it has
    not acked); its offsets."""
    return {shard: storage.group(opts.stream, shard, opts.group).offset for shard in shards}


def _plan(storage: Log, opts: ShipOptions, shipper: Shipper, shards: list[int], state: LakeState,
          given: pa.StructType | None) -> RunPlan | None:
    """Plans a new run (None: nothing new after all) and writes the plan."""
    offsets = register_group(storage, opts, shards)
    starts: Offsets = {}
    ends: Offsets = {}
    for shard in shards:
        starts[shard] = max(offsets[shard], state.done.get(shard, 0))
        ends[shard] = max(durable_end(storage, opts.stream, shard), starts[shard])
    ends = cap(starts, ends, opts.max_entries)
    if all(starts[s] >= ends[s] for s in shards):
        return None
    table_type = LakeTable.main(opts.lake).value_type()
    if given is not None:
        check_given(given, table_type, opts.signal)
        value_type, evolve = given, False
    else:
        value_type = sample_value_type(storage, opts.stream, starts, ends, opts.sample, table_type)
        evolve = True
    check_value_type(value_type, opts.event_time_field)
    run = max([state.committed, *plan_runs(opts.lake, shipper)]) + 1
    plan = RunPlan(run, opts.stream, shipper.incarnation, opts.group,
                   {s: (starts[s], ends[s]) for s in shards}, struct_to_json(value_type), evolve,
                   opts.entries_per_task, opts.event_time_field, opts.event_time_unit,
                   otlp=opts.signal)
    write_plan(opts.lake, plan)
    cut_point("spark_ship.planned")
    return plan


def check_given(given: pa.StructType, table_type: pa.StructType, signal: str | None = None) -> None:
    """A given schema (``signal``'s built-in one, if given) may add columns, not change one."""
    columns = {f.name: f.type for f in table_type}
    wrong = [f for f in given if f.name in columns and columns[f.name] != f.type]
    if wrong:
        what = f"the built-in schema of OTLP {signal}" if signal else "--schema"
        raise ValueError(f"{what} changes the type of a column the lake has: " + "; ".join(
            f"{f.name} is {type_name(columns[f.name])} in the lake, {type_name(f.type)} in the schema"
            for f in wrong))


def durable_end(storage: Log, stream: str, shard: int) -> int:
    """The shard's committed end, once every entry before it is durable: a
    plan (and so a commit) never names entries a power cut can take back -
    the log would give their numbers to new entries, which the next run,
    starting after the commit, would never ship."""
    end = bounds(storage, stream, shard)[1]
    if storage.shard_stats(stream, shard).durable_entry < end:
        storage.sync(stream, shard)  # up to the committed end at least
    return end


# ---- running ----------------------------------------------------------------------------

def _execute(spark: Any, opts: ShipOptions, plan: RunPlan) -> RunOutcome:
    from .source import split

    live = {s: r for s, r in plan.ranges.items() if r[0] < r[1]}
    starts = {s: a for s, (a, _) in live.items()}
    ends = {s: b for s, (_, b) in live.items()}
    tasks = list(enumerate(split(starts, ends, plan.entries_per_task)))
    value_type = plan.value_type
    files = _run_tasks(spark, opts, plan, value_type, plan.evolve and not plan.resolved, tasks)
    cut_point("spark_ship.written")
    main = LakeTable.main(opts.lake)
    if plan.resolved:  # a redo: the schema was settled, its columns added
        schema, added = value_type, main.add_columns(value_type)
    else:
        schema, files, added = _settle(spark, opts, plan, files, tasks)
        plan.value_schema, plan.resolved = struct_to_json(schema), True
        write_plan(opts.lake, plan)
        cut_point("spark_ship.resolved")
    data = [f for f in files if f.kind == "data"]
    rejects = [f for f in files if f.kind == "rejects"]
    rows, rejected = sum(f.rows for f in data), sum(f.rows for f in rejects)
    metadata = {"comet.app": plan.shipper.app_id, "comet.stream": plan.stream,
                "comet.group": plan.group, "comet.incarnation": plan.incarnation,
                "comet.run": plan.run, "comet.ranges": ranges_text(plan.ranges.items()),
                "comet.rows": rows, "comet.rejects": rejected,
                "comet.missing": plan.entries - rows - rejected}
    started = time.monotonic()
    if rejects:  # first: the main table's commit is the run's
        LakeTable.rejects(opts.lake).commit(rejects, rejects_schema(), plan.shipper.app_id,
                                            plan.run, metadata)
    else:
        LakeTable.rejects(opts.lake).ensure(rejects_schema())
    cut_point("spark_ship.committing")
    if main.commit(data, main_schema(schema), plan.shipper.app_id, plan.run, metadata) is None:
        # Committed by another run of this shipper since this one read the
        # table (it held the lock before this one, whose lease had run out):
        # its ranges are not this plan's, so nothing here may be acked.
        raise LakeBusy(f"run {plan.run} of {plan.shipper.app_id} was committed by another "
                       f"spark-ship while this one ran (its lock's lease ran out?): this run's "
                       "files are not in the lake and nothing was acked; run again")
    commit_seconds = time.monotonic() - started
    cut_point("spark_ship.committed")
    return RunOutcome(files, rows, rejected, added, commit_seconds)


def _run_tasks(spark: Any, opts: ShipOptions, plan: RunPlan, value_type: pa.StructType,
               evolve: bool, tasks: list[tuple[int, Any]]) -> list[WrittenFile]:
    from .writer import ShipTask

    if not tasks:
        return []
    # Only the table's columns are fixed: a field the run's sample found is
    # new, and a task may still widen it (long to double), as it would one it found.
    fixed = tuple(f.name for f in LakeTable.main(opts.lake).value_type()) if evolve else None
    job = ShipTask(os.path.abspath(opts.data_dir), opts.lake, plan.stream, plan.run,
                   uuid.uuid4().hex[:12], temp_rel(plan.shipper), value_type, evolve,
                   plan.event_time_field, plan.event_time_unit, fixed=fixed,
                   incarnation=plan.incarnation, otlp=plan.otlp)
    # As many Spark partitions as cores, each taking its tasks in turn: a
    # Spark task costs ~0.1 s to schedule, a plan's task numbers stay the same.
    slices = min(len(tasks), max(1, spark.sparkContext.defaultParallelism))
    files: list[WrittenFile] = spark.sparkContext.parallelize(tasks, slices).mapPartitions(job).collect()
    return sorted(files, key=lambda f: (f.task, f.path))


def _settle(spark: Any, opts: ShipOptions, plan: RunPlan, files: list[WrittenFile],
            tasks: list[tuple[int, Any]]) -> tuple[pa.StructType, list[WrittenFile], list[str]]:
    """The run's schema (``evolve.resolve``), its new columns added to the
    table; the tasks whose files disagree with it are run again with it
    (their values of another type become rejects)."""
    main = LakeTable.main(opts.lake)
    for _ in range(COMMIT_ATTEMPTS):
        seen = [plan.value_type] + [f.value_type for f in files if f.value_type is not None]
        schema = resolve(main.value_type(), seen)
        again = sorted({f.task for f in files if f.value_type is not None
                        and not fits(f.value_type, schema)})
        if again:
            event(log, "tasks_rerun", run=plan.run, tasks=again,
                  reason="a new field's type differs between tasks or from the lake's column")
            for f in files:
                if f.task in again:
                    opts.lake.delete(_file_rel(f))
            files = [f for f in files if f.task not in again] + _run_tasks(
                spark, opts, plan, schema, False, [tasks[t] for t in again])
        try:
            return schema, files, main.add_columns(schema)
        except SchemaConflict:
            continue  # another writer added one of these columns meanwhile: settle again
    raise RuntimeError("the lake's schema kept changing under this run: try again")


def _file_rel(f: WrittenFile) -> str:
    return f"{REJECTS_DIR}/{f.path}" if f.kind == "rejects" else f.path


def acks_behind(storage: Log, shipper: Shipper, ranges: dict[int, tuple[int, int]]) -> bool:
    """The group is not acked to the end of ``ranges`` in some shard (so
    ``cut_point("spark_ship.acking")`` is where acks are being done, a redo's too)."""
    for shard, (start, end) in ranges.items():
        if end > start:
            try:
                if storage.group(shipper.stream, shard, shipper.group, create=False).offset < end:
                    return True
            except GroupNotFound:
                return True
    return False


def _ack(storage: Log, stream: str, group: str, ranges: dict[int, tuple[int, int]]) -> dict[int, int]:
    out = {}
    for shard, (start, end) in sorted(ranges.items()):
        if shard == max(ranges):
            cut_point("spark_ship.acking")
        g = storage.group(stream, shard, group)
        out[shard] = g.ack(end - 1) if end > start else g.offset
    return out
