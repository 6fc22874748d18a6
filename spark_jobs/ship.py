"""``comet spark-ship``: a stream into a partitioned Parquet lake, exactly once.

    report = ship(ShipOptions("./data", "events", Lake("s3://bucket/lake")), spark_session)

One call is one run (see ``plan.py`` for the protocol): finish what a
crashed run left, or plan a new run from the group's offsets to the
committed ends, read and parse each range and write its Parquet in a Spark
task (``writer.ShipTask``), publish, write the manifest, ack.  Under
spark-submit: ``submit.py``.

Spark is started last, and only for work: every check that needs no JVM
(the options, the lake, the stream, the group, what is new) comes first,
and a run with nothing to ship never starts it.  The value schema is
checked by Spark's parser as soon as the session is up, before any job
(``schema.py``).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, cast

from storage_c import Config, GroupNotFound, Log, check_group_name
from storage_c.files import fsync_dir, remove_stale_temp_files
from storage_c.jsonlog import event

from .lakefs import Lake
from .offsets import Offsets, SourceOptions, bounds, cap, shard_list, to_json
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
from .schema import check_schema, infer_schema, struct_of, value_ddl

if TYPE_CHECKING:
    import pyarrow as pa

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
    StructType's JSON; None: the lake's schema so far, or inferred from a
    sample on the first run."""
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
    """Wall time of the whole call, Spark's start included."""
    acked: dict[int, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "resumed": self.resumed, "rows": self.rows,
                "rejects": self.rejects, "missing": self.missing, "files": self.files,
                "seconds": round(self.seconds, 3), "acked": to_json(self.acked)}


@dataclass
class LakeState:
    """Where the lake stands for a stream, read without Spark."""

    pending: RunPlan | None = None
    """A planned run without a manifest: a crash interrupted it."""
    done: Offsets = field(default_factory=dict)
    """Per shard, the end of the last committed run."""
    known_ddl: str | None = None
    """The value schema of the last committed run."""
    new_entries: bool = False
    """Entries past the group's offsets (and ``done``) in some shard."""


def ship(opts: ShipOptions, spark: Callable[[], Any]) -> ShipReport:
    """Removes what killed runs left (``remove_leftovers``), finishes a run a
    crash interrupted, if any, then ships what is new in one more run.
    ``spark()`` gives the Spark session: it is called once, and only when
    there is work for Spark."""
    t0 = time.monotonic()
    check_group_name(opts.group)
    if opts.event_time_unit not in EVENT_TIME_UNITS:
        raise ValueError(f"event time unit {opts.event_time_unit!r}: use one of {EVENT_TIME_UNITS}")
    given_ddl = value_ddl(opts.value_schema) if opts.value_schema else None
    lake = opts.lake
    lake.check()
    remove_leftovers(lake, opts.stream)
    report = ShipReport(None)
    session = None
    # A reader: the run registers its group and acks it, like any consumer,
    # with the flusher that makes the acks durable.
    with Log(opts.data_dir, Config.reader()) as storage:
        shards = shard_list(storage, SourceOptions(opts.data_dir, opts.stream))
        while True:
            state = lake_state(storage, lake, opts, shards)
            if state.pending is None and not state.new_entries:
                register_group(storage, opts, shards)  # retention keeps its data from now on
                break
            if session is None:
                session = spark()
                if given_ddl:
                    check_schema(given_ddl, opts.event_time_field)
            plan, resumed = state.pending, True
            if plan is None:
                plan, resumed = _plan(session, storage, lake, opts, shards, state, given_ddl), False
            if plan is None:
                break
            event(log, "run_start", run=plan.run, resumed=resumed, entries=plan.entries)
            manifest = _execute(session, lake, opts, plan)
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
    event(log, "done", **report.to_dict())
    return report


# ---- what killed runs left ---------------------------------------------------------------

def remove_leftovers(lake: Lake, stream: str) -> dict[str, object]:
    """Removes what killed runs left and no rerun rewrites, before a run starts.

    - Temporary files of plans and manifests (local lakes only: S3 PUTs have
      none) that no writer will finish: ``storage_c.files.remove_stale_temp_files``
      (its writer is dead, or the file is over an hour old).  spark-ship holds
      no lock on the lake, so a file of a live writer (another run, against
      the rule of one run per lake and stream) is kept.
    - The staging directories of runs that have a manifest: after its commit
      point nobody writes there (files a killed task or an executor that
      outlived its driver put there, or a crash before the run removed it).

    The staging directory of a run without a manifest is not touched here: that
    run is redone next, and its redo starts by removing it whole."""
    temp_files = []
    if not lake.is_s3:
        for folder in ("plans", "manifests"):
            for path in remove_stale_temp_files(Path(lake.path(meta_dir(stream), folder))):
                temp_files.append(f"{meta_dir(stream)}/{folder}/{path.name}")
    published = set(manifest_runs(lake, stream))
    staged = [int(name) for name in lake.list_dirs(f"{meta_dir(stream)}/staging")
              if name.isdigit() and int(name) in published]
    for run in staged:
        lake.delete_tree(staging_rel(stream, run))
    out: dict[str, object] = {"temp_files": temp_files, "staging_runs": staged}
    if temp_files or staged:
        event(log, "removed_leftovers", stream=stream, temp_files=temp_files, staging_runs=staged)
    return out


# ---- planning ---------------------------------------------------------------------------

def lake_state(storage: Log, lake: Lake, opts: ShipOptions, shards: list[int]) -> LakeState:
    """The lake's state for the stream, and whether anything is new: no
    Spark, and no group registered (a run that fails later leaves none).
    Redoes the last committed run's ack (a crash may have come before it)."""
    planned = plan_runs(lake, opts.stream)
    published = manifest_runs(lake, opts.stream)
    pending = [r for r in planned if r not in set(published)]
    if pending:
        plan = read_plan(lake, opts.stream, pending[-1])
        if plan.group != opts.group:
            raise ValueError(f"run {plan.run} of {opts.stream!r} in {lake.url} was planned for "
                             f"group {plan.group!r}, not {opts.group!r}: finish it with that group")
        return LakeState(pending=plan)
    state = LakeState()
    if published:
        last = read_manifest(lake, opts.stream, published[-1])
        if last.group != opts.group:
            raise ValueError(f"the lake {lake.url} is shipped by group {last.group!r}, "
                             f"not {opts.group!r}")
        _ack(storage, last.stream, last.group, last.ranges)
        state.done = {s: end for s, (_, end) in last.ranges.items()}
        state.known_ddl = last.value_ddl  # the lake keeps one schema unless told otherwise
    for shard in shards:
        first, end = bounds(storage, opts.stream, shard)
        try:
            offset = storage.group(opts.stream, shard, opts.group, create=False).offset
        except GroupNotFound:
            offset = first  # where registering it would put it
        if max(offset, state.done.get(shard, 0)) < end:
            state.new_entries = True
    return state


def register_group(storage: Log, opts: ShipOptions, shards: list[int]) -> dict[int, int]:
    """Registers the run's group in every shard (retention keeps what it has
    not acked); its offsets."""
    return {shard: storage.group(opts.stream, shard, opts.group).offset for shard in shards}


def _plan(spark: Any, storage: Log, lake: Lake, opts: ShipOptions, shards: list[int],
          state: LakeState, given_ddl: str | None) -> RunPlan | None:
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
    ddl = (given_ddl or state.known_ddl
           or infer_schema(spark, storage, opts.stream, starts, ends, opts.sample))
    check_schema(ddl, opts.event_time_field)
    planned = plan_runs(lake, opts.stream)
    run = (max(planned) if planned else 0) + 1
    plan = RunPlan(run, opts.stream, opts.group, {s: (starts[s], ends[s]) for s in shards},
                   ddl, opts.entries_per_task, opts.event_time_field, opts.event_time_unit)
    lake.write_atomically(plan_rel(opts.stream, run), plan.to_json())
    crash_point("planned")
    return plan


def durable_end(storage: Log, stream: str, shard: int) -> int:
    """The shard's committed end, once every entry before it is durable: a plan
    (and so a manifest) never names entries a power cut can take back - the
    log would give their numbers to new entries, which the next run, starting
    after the manifest, would never ship."""
    end = bounds(storage, stream, shard)[1]
    if storage.shard_stats(stream, shard).durable_entry < end:
        storage.sync(stream, shard)  # up to the committed end at least
    return end


# ---- running ----------------------------------------------------------------------------

def crash_point(name: str) -> None:
    """Fault injection for the crash tests: ``COMET_SPARK_SHIP_CRASH=<name>``
    kills this process with SIGKILL at that point of a run."""
    if os.environ.get("COMET_SPARK_SHIP_CRASH") == name:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


def _execute(spark: Any, lake: Lake, opts: ShipOptions, plan: RunPlan) -> Manifest:
    from pyspark.sql.pandas.types import to_arrow_type

    from .source import split
    from .writer import ShipTask

    staging = staging_rel(plan.stream, plan.run)
    lake.delete_tree(staging)  # what a crashed attempt left is rewritten whole
    live = {s: r for s, r in plan.ranges.items() if r[0] < r[1]}
    value_type = cast("pa.StructType", to_arrow_type(struct_of(plan.value_ddl), timezone="UTC"))
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
