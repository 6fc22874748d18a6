"""Power cuts while ``comet spark-ship`` ships a stream into a local lake: exactly once.

The log, the group's offsets and the lake (its two Delta tables, the run
plans) are all on the power-cut mount.  In each round a writer appends JSON
entries (durability ``interval``, a 10 s flush; every 40th entry is not JSON:
a reject) while the real ``comet spark-ship`` command runs (Spark
``local[2]``, a checkpoint every 2 versions); the cut comes at one of the
run's cut points (``spark_ship.*`` of storage_c/src/cutpoint.h: planned, written,
resolved, committing, committed, acking - the process waits there until the
power goes), after the run ended, or at a random moment of the run; in the
``clean`` mode or the ``pages`` one (the page cache wrote back some of what
was not synced).  After each cut, before anything reopens the log or the
lake, the tables are read with deltalake as any reader would (nothing
repairs them first: ``LakeTable.repair`` runs when the next spark-ship
starts); the next writer's reopen says which entries survived.  Checked
after every cut:

- both tables read; the main table's commits are runs 1, 2, ... (the app
  transaction says the last), whose ranges run per shard from entry 0
  without a gap or an overlap, and end at surviving entries (the log would
  give later numbers to new entries, which the next run, starting after the
  commit, would never ship);
- every entry of a committed run is there once, as a row (with its values)
  or a reject (with its bytes), and nothing else is - but the rejects the
  next run committed before its main commit (its rejects table commit comes
  first); the group's acknowledged offset (as the offsets file holds it
  after the cut) is not past the committed runs;
- the next round's run is the rerun; after the last cut a run to the end
  leaves every surviving entry in the lake exactly once, as deltalake,
  Polars and DuckDB read it.

Spark takes ~5 s to start on the CI box's 2 CPUs and a cut kills the driver,
so every cut costs a driver start (~15 s a round in all):
POWERCUT_SPARK_CUTS (default 15, ~4 min) cuts rather than 30, each crash
point and the end of a run hit once, the others at random moments (the test
prints where).  The regression tests below add one cut each: at the end of
a run, at ``committed``, and after a run killed between its commit and the
commit's sync (``P unsynced-main``, writer.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ..support.lake_readers import (
    MAIN_KEYS, REJECT_KEYS, RunCommit, is_table, keys_by_reader, run_commits)
from .checks import shard_entries
from .harness import PowerCutFS, Writer, discard_output, drain, make_synced_dir, read_state, seeded
from .scenarios import durable_stream

SPARK_CUTS = int(os.environ.get("POWERCUT_SPARK_CUTS", "15"))
POINTS = [*(f"spark_ship.{step}" for step in ("planned", "written", "resolved", "committing", "committed",
                                               "acking")), "end"]
# fsync_interval_ms = 10 s: a round takes less, so what a run plans is not
# durable in the log unless the run makes it so
ENV = {"POWERCUT_RATE": "100", "POWERCUT_JSON": "1", "POWERCUT_FSYNC_MS": "10000",
       "POWERCUT_BAD": "40"}
SHIP_ENV = {"POWERCUT_CHECKPOINT_EVERY": "2"}


@dataclass
class LakeView:
    """What a Delta reader sees of the lake."""

    runs: list[RunCommit] = field(default_factory=list)
    reject_runs: list[RunCommit] = field(default_factory=list)
    rows: list[tuple[int, int, str, str]] = field(default_factory=list)
    """(shard, entry, p, pad) of every row of the main table."""
    rejects: list[tuple[int, int, bytes]] = field(default_factory=list)
    """(shard, entry, value) of every row of the rejects table."""


def read_lake(lake: Path, where: str) -> LakeView:
    """The lake's tables as deltalake's log lists them now, read by pyarrow
    (spark_jobs.lake.read; the tables must read)."""
    from spark_jobs.lake.read import read_table
    from spark_jobs.lake.lakefs import Lake

    view = LakeView()
    for table, kind in ((lake, "main"), (lake / "_rejects", "rejects")):
        if not is_table(table):
            continue
        try:
            runs = run_commits(table)
            read = read_table(Lake(str(lake)), kind="data" if kind == "main" else "rejects").to_pydict()
        except Exception as exc:
            log_dir = table / "_delta_log"
            raise AssertionError(f"{where}: the {kind} table does not read ({exc}); its log: "
                                 f"{sorted((p.name, p.stat().st_size) for p in log_dir.iterdir())}"
                                 ) from None
        if kind == "main":
            view.runs = runs
            view.rows = list(zip(read["_comet_shard"], read["_comet_entry"], read["p"], read["pad"]))
        else:
            view.reject_runs = runs
            view.rejects = list(zip(read["shard"], read["entry"], read["value"]))
    return view


def check_lake(view: LakeView, state: dict, where: str, complete: bool) -> None:
    shards = state["streams"]["events"]
    present = [shard_entries(info) for info in shards]
    committed = [c.run for c in view.runs]
    assert committed == list(range(1, len(committed) + 1)), f"{where}: runs committed: {committed}"
    ends = [0] * len(shards)
    for c in view.runs:
        run = f"run {c.run}"
        assert c.missing == 0, f"{where}: {run} found {c.missing} entries missing"
        for shard, (start, end) in c.ranges.items():
            assert start == ends[shard], (
                f"{where}: {run} ships shard {shard} from {start}, the runs before it up to "
                f"{ends[shard]}: {'a gap' if start > ends[shard] else 'entries twice'}")
            assert end <= shards[shard]["next"], (
                f"{where}: {run}'s commit covers shard {shard} up to {end - 1}, but only entries "
                f"below {shards[shard]['next']} survived the cut")
            ends[shard] = end
    next_run = {c.run for c in view.reject_runs} - set(committed)
    assert next_run <= {len(committed) + 1}, (
        f"{where}: the rejects table has runs {sorted(c.run for c in view.reject_runs)}, the "
        f"main table {committed}")
    pending_ends = {s: b for c in view.reject_runs if c.run in next_run for s, (_, b) in c.ranges.items()}
    seen: set[tuple[int, int]] = set()
    for shard, entry, p, pad in view.rows:
        assert entry < ends[shard], f"{where}: a row of entry {shard}/{entry}, of no committed run"
        assert (shard, entry) not in seen, f"{where}: entry {shard}/{entry} is in the lake twice"
        seen.add((shard, entry))
        stored = present[shard].get(entry)
        assert stored is not None and json.loads(stored) == {"p": p, "pad": pad}, (
            f"{where}: the row of entry {shard}/{entry} is {(p, pad)}, the log holds {stored}")
    for shard, entry, value in view.rejects:
        assert entry < max(ends[shard], pending_ends.get(shard, 0)), (
            f"{where}: a reject of entry {shard}/{entry}, of no committed run")
        assert (shard, entry) not in seen, f"{where}: entry {shard}/{entry} is in the lake twice"
        seen.add((shard, entry))
        assert value.decode() == present[shard].get(entry), (
            f"{where}: the reject of entry {shard}/{entry} is {value!r}, the log holds "
            f"{present[shard].get(entry)}")
    for shard, info in enumerate(shards):
        shipped = {e for s, e in seen if s == shard and e < ends[shard]}
        assert shipped == set(range(ends[shard])), (
            f"{where}: shard {shard}: the commits cover entries below {ends[shard]}, "
            f"{sorted(set(range(ends[shard])) - shipped)[:20]} of them are not in the lake")
        acked = state["raw_offsets"].get(f"events/shard-{shard:04d}", {}).get("spark-ship")
        assert acked is None or acked <= ends[shard], (
            f"{where}: shard {shard}: group spark-ship acknowledged entries below {acked}, the "
            f"lake's commits end at {ends[shard]}")
        if complete:
            assert ends[shard] == info["next"], (
                f"{where}: shard {shard}: after a run to the end the lake holds entries below "
                f"{ends[shard]}, the log {info['next']}")


def wait_for(proc: Writer, prefix: str, event: str | None = None) -> dict | None:
    """Reads the driver's lines until one starts with ``prefix`` (with
    ``event``: the JSON log line ``L {...}`` of that event, returned); None
    if it ended first."""
    assert proc.stdout
    while True:
        line = proc.stdout.readline()
        if not line:
            return None
        if line.startswith(prefix):
            if event is None:
                return {}
            logged = json.loads(line[2:])
            if logged.get("event") == event:
                return dict(logged)


def spark_ship(powercut: PowerCutFS, data: Path, rnd: int, lake: Path, pause_at: str,
               *dump: str) -> Writer:
    return powercut.spawn("spark-ship", data, rnd, 0, lake, pause_at, *dump, env=SHIP_ENV,
                          stdin=subprocess.PIPE, whole_namespace=True)


@pytest.mark.timeout(900)  # ~4 min alone; a JVM start takes longer on a busy box
def test_spark_ship_to_a_local_lake_exactly_once_across_power_cuts(powercut: PowerCutFS) -> None:
    data = make_synced_dir(powercut.mnt / "data")
    lake = make_synced_dir(powercut.mnt / "lake")
    rng = seeded("spark-ship")
    durable_stream(powercut, data, "interval", ENV)
    started = time.monotonic()
    points = POINTS[:] + ["random"] * max(0, SPARK_CUTS - len(POINTS))
    rng.shuffle(points)
    hit: dict[str, int] = {}
    rejects_ahead = 0  # cuts after which the rejects table had a run the main table had not
    for rnd in range(1, SPARK_CUTS + 1):
        where = f"after cut {rnd - 1}"
        before = read_lake(lake, where)  # as the cut left it, before any process runs
        rejects_ahead += len({c.run for c in before.reject_runs} - {c.run for c in before.runs})
        writer = powercut.spawn("append", data, rnd, rng.randrange(1 << 30), "interval", 2,
                                env=ENV)
        check_lake(before, read_state(writer), where, complete=False)
        drained = discard_output(writer)
        point = points[rnd - 1]
        driver = spark_ship(powercut, data, rnd, lake, point)
        if point == "random":
            assert wait_for(driver, "L ", event="run_start") is not None, (
                f"round {rnd}: spark-ship ended before its run started: "
                f"{driver.stderr_path.read_text()[-3000:]}")
            time.sleep(rng.uniform(0, 3.0))
        elif point == "end":  # the run is over, the process closed the log (acks synced)
            assert wait_for(driver, "X") is not None, \
                f"round {rnd}: {driver.stderr_path.read_text()[-3000:]}"
            driver.wait()
        else:
            assert wait_for(driver, f"P {point}") is not None, (
                f"round {rnd}: spark-ship never reached {point} (exit {driver.wait()}): "
                f"{driver.stderr_path.read_text()[-3000:]}")
        mode = rng.choice(["clean", "pages"])
        hit[f"{point}/{mode}"] = hit.get(f"{point}/{mode}", 0) + 1
        powercut.cut(mode, rng.randrange(1 << 30))
        drained.join()
        drain(driver)
    where = f"after cut {SPARK_CUTS}"
    before = read_lake(lake, where)
    last = spark_ship(powercut, data, SPARK_CUTS + 1, lake, "none", "dump")
    state = read_state(last)
    check_lake(before, state, where, complete=False)
    assert wait_for(last, "X") is not None, \
        f"the last run failed: {last.stderr_path.read_text()[-3000:]}"
    assert last.wait() == 0
    end = read_lake(lake, "at the end")
    check_lake(end, state, "after the run to the end", complete=True)
    for table, columns, keys in ((lake, MAIN_KEYS, [r[:2] for r in end.rows]),
                                 (lake / "_rejects", REJECT_KEYS, [r[:2] for r in end.rejects])):
        for reader, seen in keys_by_reader(table, columns).items():
            assert seen == sorted(keys), f"at the end {reader} reads {len(seen)} rows of {table}"
    assert end.rejects, "no entry was rejected: the two tables' commit order went untested"
    elapsed = time.monotonic() - started
    rows = sum(s["next"] for s in state["streams"]["events"])
    checkpoints = len(list((lake / "_delta_log").glob("*.checkpoint.parquet")))
    print(f"\nspark-ship: {SPARK_CUTS} cuts (at {sorted(hit.items())}), {rows} entries in the "
          f"lake at the end ({len(end.rejects)} rejects), exactly once, {len(end.runs)} runs, "
          f"{checkpoints} checkpoints; {rejects_ahead} cuts left a run's rejects committed, not "
          f"its rows; {elapsed:.1f} s ({elapsed / SPARK_CUTS:.1f} s per cut)")


# ---- regression tests: one cut each ------------------------------------------------------


def appending_stream(powercut: PowerCutFS) -> tuple[Path, Path, Writer, threading.Thread]:
    """The data directory with the stream created durably, the lake's
    directory, and a writer appending (``interval``, 10 s flush) whose output
    a thread drains."""
    data = make_synced_dir(powercut.mnt / "data")
    lake = make_synced_dir(powercut.mnt / "lake")
    durable_stream(powercut, data, "always", ENV)
    writer = powercut.spawn("append", data, 1, 1, "interval", 2, env=ENV)
    read_state(writer)
    return data, lake, writer, discard_output(writer)


def one_run_then_cut(powercut: PowerCutFS, point: str) -> tuple[LakeView, dict]:
    """The stream exists durably, a writer appends (``interval``, 10 s flush),
    one spark-ship run goes to ``point`` (a crash point, or ``end``: the run is
    over), the power goes.  Returns the lake as read and what survived."""
    data, lake, writer, drained = appending_stream(powercut)
    driver = spark_ship(powercut, data, 1, lake, point)
    assert wait_for(driver, "X" if point == "end" else f"P {point}") is not None, \
        driver.stderr_path.read_text()[-3000:]
    powercut.cut("clean", 1)
    drained.join()
    drain(driver)
    view = read_lake(lake, "after the cut")
    assert view.runs, f"no commit survived the cut at {point}"
    return view, read_state(powercut.spawn("dump", data, 2, 0, "interval", 2))


def test_a_commit_names_only_durable_entries(powercut: PowerCutFS) -> None:
    """Was a bug: a run planned up to the committed end of each shard, entries
    the writers had not synced yet (``interval``).  A power cut after the
    commit took them back from the log but not from the lake; the log gave
    their numbers to new entries, which the next run (starting after the
    commit) never shipped."""
    view, state = one_run_then_cut(powercut, "spark_ship.committed")
    check_lake(view, state, "after the cut", complete=False)


def test_lake_directories_survive_a_power_cut(powercut: PowerCutFS) -> None:
    """Was a bug: directories the run created (the run plans', new
    ``stream=/dt=/hour=`` partitions, the table's ``_delta_log``) were not
    synced into their parents (a file's sync makes its own directory's entry
    durable, not that directory's).  After a cut following a whole run, the
    commit and the files were gone, the group's acks (synced when the run
    closed the log) not: the run's entries were never to be shipped again."""
    view, state = one_run_then_cut(powercut, "end")
    check_lake(view, state, "after the cut", complete=False)
    lake = powercut.mnt / "lake"
    assert list((lake / "_comet" / "runs" / "events" / "spark-ship").glob("*/00000001.json")), \
        "the run's plan is gone: the next run would not know where to start"
    assert view.reject_runs, "the rejects table is gone"


def test_a_commit_a_killed_run_left_is_synced_before_it_is_acked(powercut: PowerCutFS) -> None:
    """Was a bug: delta-rs does not sync a commit, the run does it right
    after.  A run killed in between left its commit in the page cache only;
    the next run read that run as committed and acked it (nothing new to
    ship: it closed the log, the acks synced); a power cut then took the
    commit back, not the acks - the run's entries were never to be shipped.
    A run now syncs a table's log before reading it (``LakeTable.repair``)."""
    data, lake, writer, drained = appending_stream(powercut)
    time.sleep(1.0)
    powercut.kill(writer)  # nothing new after the first run: the second one commits nothing
    drained.join()
    first = spark_ship(powercut, data, 1, lake, "unsynced-main")
    assert wait_for(first, "P unsynced-main") is not None, first.stderr_path.read_text()[-3000:]
    powercut.kill(first)
    drain(first)
    second = spark_ship(powercut, data, 2, lake, "none")
    done = wait_for(second, "L ", event="done")
    assert done is not None and done["run"] is None, (done, second.stderr_path.read_text()[-3000:])
    assert wait_for(second, "X") is not None and second.wait() == 0
    drain(second)
    powercut.cut("clean", 1)
    view = read_lake(lake, "after the cut")
    state = read_state(powercut.spawn("dump", data, 3, 0, "interval", 2))
    check_lake(view, state, "after the cut", complete=True)
