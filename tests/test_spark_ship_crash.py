"""``comet spark-ship`` ended at every step of its run (its cut points,
``COMET_CUT_POINT``: the process dies there as under a SIGKILL), and killed
with SIGKILL at random moments: after each kill the lake, read as users read
it (deltalake, Polars, DuckDB), holds no entry twice and every row of every committed run;
a final run leaves every entry exactly once.  (Power cuts:
tests/powercut/test_spark_ship.py.)"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import orjson
import pytest

from spark_jobs.lake.delta import LakeTable
from spark_jobs.lake.lakefs import Lake
from spark_jobs.spark.ship import ShipOptions, ship
from storage_c import Config, Log
from storage_c.testing import CUT_EXIT

from .support.lake import check_exactly_once, in_process
from .support.lake_readers import (
    MAIN_KEYS, READERS, REJECT_KEYS, Keys, keys_by_reader, run_commits)
from .support.server import COMET
from .support.storage import fill, read_all

CFG = Config(shards=4, segment_bytes=1 << 20, compression_threshold=512)
T0_MS = 1_763_700_000_000  # 2025-11-21T04:40Z
BAD = [b"\xff not json", b'{"id": "x"}', b"[1, 2]"]
"""Entries that go to the rejects table: not JSON, a field of another type, not an object."""
CRASH_POINTS = [f"spark_ship.{step}" for step in
                ("planned", "written", "resolved", "committing", "committed", "acking")]
"""The cut points of a run (storage_c/src/cutpoint.h), in its order."""


def add_events(data_dir: Path, n: int, start: int) -> None:
    """``n`` events whose event time walks over several hours (some large:
    compressed), and a bad entry in one shard."""
    with Log(data_dir, CFG) as log:
        fill(log, "ev", [orjson.dumps({"id": i, "device": f"dev-{i % 5}", "temp": 20.0 + i % 10,
                                       "at": T0_MS + i * 37_000, "note": "n" * (i % 900)})
                         for i in range(start, start + n)], batch=1)
        log.append("ev", BAD[start % len(BAD)], shard=start % CFG.shards)


# ---- the real command, killed ------------------------------------------------------------

def run_job(data_dir: Path, lake_dir: Path, *, crash: str | None = None,
            kill_after: float | None = None, timeout: float = 240) -> int:
    """``comet spark-ship`` in its own session; ended at the cut point
    ``crash`` or killed with SIGKILL after ``kill_after`` seconds.  Returns
    the exit status."""
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1",
               COMET_SPARK_LOG_LEVEL="ERROR")
    env.pop("COMET_CUT_POINT", None)
    if crash:
        env["COMET_CUT_POINT"] = crash
    proc = subprocess.Popen([str(COMET), "spark-ship", str(data_dir), "ev", str(lake_dir),
                             "--event-time-field", "at", "--entries-per-task", "700",
                             "--master", "local[2]"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        if kill_after is not None:
            try:
                proc.wait(kill_after)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)  # the driver only: its JVM must follow
        _, err = proc.communicate(timeout=timeout)
    finally:
        wait_group_gone(proc.pid)
    if proc.returncode not in (0, -signal.SIGKILL, CUT_EXIT):
        raise AssertionError(f"spark-ship failed ({proc.returncode}):\n{err.decode()[-3000:]}")
    if proc.returncode == CUT_EXIT:
        assert crash and f"comet: cut point {crash}\n" in err.decode(), (
            f"spark-ship died at another cut point than {crash}:\n{err.decode()[-3000:]}")
    return proc.returncode


def wait_group_gone(pgid: int, timeout: float = 20) -> None:
    """The JVM and Python workers of a killed driver exit by themselves; a
    test never leaves them behind either way."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.killpg(pgid, signal.SIGKILL)
    raise AssertionError("processes of the killed spark-ship outlived it")


# ---- what a reader sees ------------------------------------------------------------------

def read_as_users(lake_dir: Path, where: str) -> tuple[Keys, Keys]:
    """(shard, entry) of the rows and of the rejects, each table read by
    every reader: they must all see the same."""
    out = []
    for table, columns in ((lake_dir, MAIN_KEYS), (lake_dir / "_rejects", REJECT_KEYS)):
        seen = keys_by_reader(table, columns)
        first = seen["deltalake"]
        for reader, keys in seen.items():
            assert keys == first, (f"{where}: {reader} reads {len(keys)} rows of {table.name}, "
                                   f"deltalake {len(first)}")
        out.append(first)
    return out[0], out[1]


def check_consistent(lake_dir: Path, where: str) -> int:
    """No entry twice; every entry of every run the main table committed is
    there (a row or a reject), and nothing else: the rejects table holds at
    most the rejects of the one run after (its commit comes first).  The
    number of runs committed."""
    rows, rejects = read_as_users(lake_dir, where)
    keys = rows + rejects
    twice = sorted({k for k in keys if keys.count(k) > 1}) if len(keys) != len(set(keys)) else []
    assert not twice, f"{where}: entries in the lake twice: {twice[:10]}"
    runs = run_commits(lake_dir)
    reject_runs = run_commits(lake_dir / "_rejects")
    committed = [c.run for c in runs]
    assert committed == list(range(1, len(runs) + 1)), f"{where}: the runs committed: {committed}"
    assert {c.run for c in reject_runs} <= set(committed) | {len(runs) + 1}, (
        f"{where}: rejects of runs {[c.run for c in reject_runs]}, main commits of {committed}")
    ends: dict[int, int] = {}
    covered: set[tuple[int, int]] = set()
    for c in runs:
        assert c.missing == 0, f"{where}: run {c.run} found {c.missing} entries missing"
        for shard, (start, end) in c.ranges.items():
            assert start == ends.get(shard, 0), (f"{where}: run {c.run} ships shard {shard} from "
                                                 f"{start}, the runs before to {ends.get(shard, 0)}")
            ends[shard] = end
            covered |= {(shard, e) for e in range(start, end)}
    assert set(rows) <= covered, f"{where}: rows of no committed run: {sorted(set(rows) - covered)[:10]}"
    lost = sorted(covered - set(keys))
    assert not lost, f"{where}: {len(lost)} entries of committed runs are not in the lake: {lost[:10]}"
    pending = {(s, e) for c in reject_runs if c.run > len(runs)
               for s, (a, b) in c.ranges.items() for e in range(a, b)}
    assert set(rejects) <= covered | pending, f"{where}: rejects of no run: {sorted(set(rejects) - covered)}"
    return len(runs)


@pytest.mark.slow
@pytest.mark.timeout(600)  # ~140 s alone; a JVM start takes much longer on a busy box
def test_exactly_once_under_sigkill(data_dir: Path, tmp_path: Path) -> None:
    lake_dir = tmp_path / "lake"
    rng = random.Random(20261121)
    took: list[tuple[str, float]] = []

    def step(crash: str | None, **kill: float) -> int:
        started = time.monotonic()
        status = run_job(data_dir, lake_dir, crash=crash, **kill)
        took.append((crash or ("random" if kill else "whole"), time.monotonic() - started))
        check_consistent(lake_dir, f"after a run to {crash or kill or 'the end'}")
        return status

    # The first run is killed acking, after its commit: about a whole run's
    # time.  (Later, a kill at "acking" comes as a run redoes the acks a kill
    # after the commit left behind: the step after "committed".)
    add_events(data_dir, 3000, 0)
    assert step("spark_ship.acking") == CUT_EXIT
    full_run_s = took[-1][1]
    # A kill at each step of the protocol, in its order (a kill before the
    # commit leaves a plan the next run redoes: it goes on to the next step),
    # and two at random moments (more, with power cuts, in
    # tests/powercut/test_spark_ship.py).
    kills: list[str | None] = [*CRASH_POINTS, None, None]
    produced = 3000
    for crash in kills:
        add_events(data_dir, 700, produced)
        produced += 700
        if crash:
            assert step(crash) == CUT_EXIT
        else:
            step(None, kill_after=rng.uniform(1.0, full_run_s))
    assert step(None) == 0  # finishes the interrupted run, ships the rest
    print(f"\nspark-ship runs (kill point, s): {[(p, round(t, 1)) for p, t in took]}")
    rows, rejects = check_exactly_once(Lake(str(lake_dir)), data_dir, "ev", CFG)
    assert (rows.num_rows, rejects.num_rows) == (produced, len(kills) + 1)
    stored = log_payloads(data_dir)
    for row in rows.to_pylist():
        event = orjson.loads(stored[(row["_comet_shard"], row["_comet_entry"])])
        assert (row["id"], row["device"], row["note"]) == (event["id"], event["device"], event["note"])
        hour = datetime.fromtimestamp(event["at"] / 1000, tz=timezone.utc)
        assert (row["stream"], row["dt"], row["hour"]) == ("ev", f"{hour:%Y-%m-%d}", hour.hour)
    for reject in rejects.to_pylist():
        assert reject["value"] == stored[(reject["shard"], reject["entry"])] in BAD
        assert reject["error"].startswith(f"shard {reject['shard']} entry {reject['entry']}: ")
    assert not [p for p in (lake_dir / "_comet" / "tmp").rglob("*") if p.is_file()]


def log_payloads(data_dir: Path) -> dict[tuple[int, int], bytes]:
    with Log(data_dir, CFG) as log:
        return {(shard, entry): payload for shard in range(CFG.shards)
                for entry, _, payload in read_all(log, "ev", shard)}


def test_a_torn_last_commit_fails_readers_until_the_next_run_repairs_it(
        data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run dies between its commit and the commit's sync, and the power
    cut that follows leaves the commit file torn: what a real filesystem may
    do (ext4 can make a new name durable before the file's data; the
    power-cut filesystem cannot, so this is built by hand).  Every Delta
    reader fails on the table until the next spark-ship starts: it removes
    the torn file - a commit never synced is of a run never acked - and
    redoes that run.  (Spark's tasks run in this process.)"""
    lake_dir = tmp_path / "lake"
    opts = ShipOptions(str(data_dir), "ev", Lake(str(lake_dir)), event_time_field="at",
                       entries_per_task=300)
    add_events(data_dir, 600, 0)
    assert ship(opts, in_process).run == 1
    add_events(data_dir, 600, 600)

    class Killed(BaseException):
        pass

    def dies_unsynced(self: LakeTable, table: object) -> None:
        if self.name == "main":
            raise Killed()

    with monkeypatch.context() as patch:
        patch.setattr(LakeTable, "made_durable", dies_unsynced)
        with pytest.raises(Killed):
            ship(opts, in_process)
    table = LakeTable.main(opts.lake).open()
    assert table is not None and table.version() == 1  # run 2's commit, not synced
    commit = lake_dir / "_delta_log" / f"{table.version():020d}.json"
    commit.write_bytes(commit.read_bytes()[:len(commit.read_bytes()) // 2])  # the cut's leftover
    for name, read in READERS.items():
        with pytest.raises(Exception, match="Json error: Truncated record"):
            read(lake_dir, MAIN_KEYS)
    report = ship(opts, in_process)
    assert (report.resumed, report.run, report.rows, report.rejects) == (2, 2, 600, 1)
    check_exactly_once(opts.lake, data_dir, "ev", CFG)
    assert [c.run for c in run_commits(lake_dir)] == [1, 2]
    check_consistent(lake_dir, "after the repair")
