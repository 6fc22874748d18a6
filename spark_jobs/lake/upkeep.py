"""``comet lake compact`` and ``comet lake vacuum``: the upkeep of the lake's
two Delta tables, beside running ``comet spark-ship`` runs.

Compaction is delta-rs's ``optimize.compact``: per partition, small files
are rewritten into larger ones, in one commit that removes the old files
and adds the new ones (``dataChange`` false: no reader sees new rows).  It
is safe beside a run: a run only appends, and delta-rs lets an append and a
compaction commit in either order (the compaction rewrote only files that
were committed when it started; the run's files are new).  A compaction
that loses a race to a commit it conflicts with (another compaction, added
columns) is tried again on the table as it is then.  The app transactions
(``txn``: each shipper's last committed run) are table state that every
commit carries forward: a compaction leaves them as they are, so the next
run of every shipper still finds its last run.  Before the first compaction
the table is told which columns its files' statistics cover
(``delta.dataSkippingStatsColumns``: the ``_comet_`` columns, which the
runs' own statistics cover too), so that a compacted file has them however
many value columns precede them (delta-rs's default covers the first 32).

Vacuum is delta-rs's ``vacuum`` in full mode: every file under a table's
root that the table does not reference and that is older than the
retention goes - files compaction replaced, and the files of attempts that
never committed (a killed run's, a task Spark ran twice).  A run's files
are written before its commit, so they are such files until it commits;
vacuum keeps them by never using a retention shorter than the age of the
oldest plan that has not committed (the run's files are all younger than
its plan, which is written first), and never shorter than
``MIN_RETENTION_HOURS`` (see there).  It is a dry run unless told to
apply.

Locally, delta-rs writes files and commits without an fsync: after each
commit the new data files, their directories and the log are synced here
(``LakeTable.made_durable``), as the runs do.
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import TYPE_CHECKING, Any

from comet.files import fsync_dir, make_dirs_durably
from comet.jsonlog import event

from .delta import COMMIT_ATTEMPTS, LakeTable, no_hooks
from .history import OPERATION_KEY
from .lakefs import Lake
from .plan import RUNS_DIR, RunPlan, Shipper

if TYPE_CHECKING:
    from deltalake import DeltaTable

log = logging.getLogger("comet.lake")

DEFAULT_RETENTION_HOURS = 168
"""Delta's own default (a week): readers of an older version, a query that
started before a compaction, find their files for that long."""
MIN_RETENTION_HOURS = 24
"""The shortest retention vacuum accepts.  A run's unfinished files are
kept by its plan whatever their age (above); this floor covers what no plan
announces: a compaction's new files between their write and its commit (a
compaction of a large lake takes hours), a store's clock that differs from
this machine's (S3 object times are the store's), and a query reading a
version that a compaction made old."""
STATS_COLUMNS = {"main": "_comet_shard,_comet_entry,_comet_time", "rejects": "shard,entry,timestamp"}
STATS_PROPERTY = "delta.dataSkippingStatsColumns"


def tables(lake: Lake) -> list[LakeTable]:
    return [LakeTable.main(lake), LakeTable.rejects(lake)]


# ---- compaction ---------------------------------------------------------------------------

def compact(lake: Lake, stream: str | None = None, target_size: int | None = None) -> dict[str, Any]:
    """Compacts both tables (only ``stream``'s partitions, if given); per
    table, what it did (None: the table does not exist)."""
    if target_size is not None and target_size <= 0:
        raise ValueError(f"target size {target_size}: give a number of bytes above 0")
    out: dict[str, Any] = {}
    for table in tables(lake):
        table.repair()  # a torn last commit of a run that never acked, as a run would first
        out[table.name] = compact_table(table, stream, target_size)
    return {"lake": lake.url, "stream": stream, "tables": out}


def compact_table(table: LakeTable, stream: str | None, target_size: int | None) -> dict[str, Any] | None:
    from deltalake import CommitProperties
    from deltalake.exceptions import CommitFailedError

    opened = table.open()
    if opened is None:
        return None
    keep_stats_columns(table, opened)
    filters = [("stream", "=", stream)] if stream is not None else None
    props = CommitProperties(custom_metadata={OPERATION_KEY: "compact"})
    for _ in range(COMMIT_ATTEMPTS):
        before = table.open()
        assert before is not None
        try:
            metrics = before.optimize.compact(partition_filters=filters, target_size=target_size,
                                              commit_properties=props,
                                              post_commithook_properties=no_hooks())
        except CommitFailedError:
            continue  # another compaction, or added columns, committed first: look again
        after = table.open()
        assert after is not None
        if metrics.get("numFilesAdded"):
            sync_new_files(table, before, after)
            table.after_commit(before.version())
        result = {"version": after.version(), "files_added": metrics.get("numFilesAdded", 0),
                  "files_removed": metrics.get("numFilesRemoved", 0),
                  "partitions": metrics.get("partitionsOptimized", 0)}
        event(log, "compacted", table=table.uri, **result)
        return result
    raise RuntimeError(f"could not compact {table.uri}: other writers kept committing")


def keep_stats_columns(table: LakeTable, opened: DeltaTable) -> None:
    """Makes the table's writers (delta-rs's compaction) keep statistics of
    the ``_comet_`` columns (one metadata commit, the first time)."""
    from deltalake.exceptions import CommitFailedError

    wanted = STATS_COLUMNS[table.name]
    for _ in range(COMMIT_ATTEMPTS):
        if opened.metadata().configuration.get(STATS_PROPERTY) == wanted:
            return
        try:
            opened.alter.set_table_properties({STATS_PROPERTY: wanted},
                                              post_commithook_properties=no_hooks())
        except CommitFailedError:
            pass
        else:
            table.after_commit(opened.version())
            return
        again = table.open()
        assert again is not None
        opened = again
    raise RuntimeError(f"could not set {STATS_PROPERTY} on {table.uri}: other writers kept committing")


def sync_new_files(table: LakeTable, before: DeltaTable, after: DeltaTable) -> list[str]:
    """Locally: syncs the data files ``after`` references and ``before`` did
    not, and their directories (delta-rs wrote them without an fsync); their
    paths."""
    if table.lake.is_s3:
        return []
    new = sorted({_local(p) for p in after.file_uris()} - {_local(p) for p in before.file_uris()})
    for path in new:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for directory in sorted({os.path.dirname(p) for p in new}):
        make_dirs_durably(directory, table.lake.root)  # a new partition directory, into its parents
        fsync_dir(directory)
    return new


def _local(uri: str) -> str:
    return uri[len("file://"):] if uri.startswith("file://") else uri


# ---- vacuum --------------------------------------------------------------------------------

def vacuum(lake: Lake, retention_hours: int = DEFAULT_RETENTION_HOURS,
           apply: bool = False) -> dict[str, Any]:
    """The files vacuum removes from both tables (removed, with ``apply``)."""
    if retention_hours < MIN_RETENTION_HOURS:
        raise ValueError(f"retention {retention_hours} hours: at least {MIN_RETENTION_HOURS} (files "
                         "a compaction has written and not yet committed, store clocks, readers "
                         "of older versions)")
    pending = pending_plans(lake)
    hours = retention_hours
    if pending:
        # a run's files are younger than its plan: retain everything since the oldest
        # pending plan was written, and an hour more for the store's clock
        oldest = min(created for _, created in pending)
        hours = max(hours, math.ceil((time.time() - oldest) / 3600) + 1)
    out: dict[str, Any] = {}
    for table in tables(lake):
        opened = table.open()
        if opened is None:
            out[table.name] = None
            continue
        files = opened.vacuum(retention_hours=hours, dry_run=not apply,
                              enforce_retention_duration=False, full=True,
                              post_commithook_properties=no_hooks())
        if apply:
            table.after_commit(opened.version())
        out[table.name] = {"files": sorted(files), "count": len(files)}
    if apply:
        event(log, "vacuumed", lake=lake.url, retention_hours=hours,
              files={k: v["count"] for k, v in out.items() if v})
    return {"lake": lake.url, "dry_run": not apply, "retention_hours": hours,
            "kept_for_runs": [rel for rel, _ in pending], "tables": out}


def pending_plans(lake: Lake) -> list[tuple[str, float]]:
    """The plans of runs that have not committed (a run going on now, or one
    a crash stopped, which the next run redoes): each plan's path and the
    time it was written."""
    main = LakeTable.main(lake)
    opened = main.open()
    out = []
    for stream in lake.list_dirs(RUNS_DIR):
        for group in lake.list_dirs(f"{RUNS_DIR}/{stream}"):
            for incarnation in lake.list_dirs(f"{RUNS_DIR}/{stream}/{group}"):
                if not incarnation.isdigit():
                    continue
                shipper = Shipper(stream, int(incarnation), group)
                committed = main.committed_run(shipper.app_id, opened)
                for name in lake.list(shipper.plans_dir):
                    stem, _, ext = name.partition(".")
                    if ext != "json" or not stem.isdigit() or int(stem) <= committed:
                        continue
                    out.append((shipper.plan_rel(int(stem)), _written(lake, shipper, int(stem))))
    return out


def _written(lake: Lake, shipper: Shipper, run: int) -> float:
    """When a plan was first written (its ``created``; a plan that does not
    read: now, which keeps every file)."""
    data = lake.read(shipper.plan_rel(run))
    try:
        return RunPlan.from_json(data).created if data is not None else time.time()
    except (ValueError, TypeError):
        return time.time()
