"""``comet lake``: history, compact, vacuum and check, beside spark-ship.

The runs are real ``comet spark-ship`` runs whose tasks run in this process
(tests/support/lake.py: no JVM); the command line itself (its JSON, its one
Error line, its exit status) runs as real ``comet lake`` processes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.spark import ship as ship_module
from spark_jobs.lake.check import check
from spark_jobs.lake.delta import LakeTable
from spark_jobs.lake.history import history
from spark_jobs.lake.read import read_table
from spark_jobs.lake.lakefs import Lake
from spark_jobs.lake.plan import Shipper, read_plan
from spark_jobs.spark.ship import ShipOptions, ship
from spark_jobs.lake.upkeep import compact, pending_plans, vacuum
from storage_c import Config, Log

from .support.lake import check_exactly_once, entry_keys, in_process
from .support.server import COMET
from .support.storage import fill

CFG = Config(shards=2, segment_bytes=1 << 20)
DAY = 24 * 3600


def events(start: int, n: int, **extra: Any) -> list[bytes]:
    """JSON events, every 7th one not JSON (a reject)."""
    return [b"not json %d" % i if i % 7 == 3 else
            orjson.dumps({"id": i, "device": f"dev-{i % 3}", **extra}) for i in range(start, start + n)]


def append(data_dir: Path, start: int, n: int, stream: str = "ev", **extra: Any) -> None:
    with Log(data_dir, CFG) as log:
        if stream not in log.streams():
            log.create_stream(stream, 2)
        fill(log, stream, events(start, n, **extra), batch=5)


def ship_in_process(data_dir: Path, lake: Lake, stream: str = "ev") -> ship_module.ShipReport:
    return ship(ShipOptions(str(data_dir), stream, lake), lambda: in_process())


def comet_lake(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(COMET), "lake", *map(str, args)], capture_output=True, text=True,
                          timeout=120, env=env)


def lake_files(lake: Path) -> dict[str, int]:
    """Every file under the lake, with its size: what "nothing changed" compares."""
    return {str(p.relative_to(lake)): p.stat().st_size for p in sorted(lake.rglob("*")) if p.is_file()}


def stop_at(monkeypatch: pytest.MonkeyPatch, point: str) -> None:
    """The next run stops at ``point`` as a crash would stop it (here an
    exception: the tasks run in this process)."""
    def crash(name: str) -> None:
        if name == point:
            raise RuntimeError(f"stopped at {name}")

    monkeypatch.setattr(ship_module, "cut_point", crash)


@pytest.fixture
def lake(tmp_path: Path) -> Lake:
    return Lake(str(tmp_path / "lake"))


# ---- history ---------------------------------------------------------------------------------

def test_history_lists_runs_and_other_operations(data_dir: Path, lake: Lake) -> None:
    append(data_dir, 0, 40)
    ship_in_process(data_dir, lake)
    append(data_dir, 40, 20, temp=21.5)  # a new field: the second run adds a column first
    ship_in_process(data_dir, lake)
    append(data_dir, 0, 10, stream="other")
    ship_in_process(data_dir, lake, "other")
    compact(lake)
    got = history(lake)["tables"]
    main = got["main"]
    assert [c["version"] for c in main] == sorted((c["version"] for c in main), reverse=True)
    runs = [c for c in main if c["kind"] == "run"]
    assert [(r["stream"], r["run"]) for r in runs] == [("other", 1), ("ev", 2), ("ev", 1)]
    with Log(data_dir, CFG) as log:
        incarnation = log.stream_created_ns("ev")
    first = runs[-1]
    assert first["app"] == Shipper("ev", incarnation, "spark-ship").app_id
    assert (first["group"], first["incarnation"], first["ranges"]) == \
        ("spark-ship", incarnation, {"0": [0, 20], "1": [0, 20]})
    assert first["rows"] + first["rejects"] == 40 and first["rejects"] == 6 and first["missing"] == 0
    kinds = [c["kind"] for c in main if c["kind"] != "run"]
    assert kinds == ["compact", "set tblproperties", "add column"], kinds
    assert main[0]["metrics"]["numFilesRemoved"] >= 2
    assert got["rejects"][0]["kind"] == "compact"
    assert [(r["stream"], r["run"]) for r in got["rejects"] if r["kind"] == "run"] == \
        [("other", 1), ("ev", 2), ("ev", 1)]
    only = history(lake, "other", limit=3)["tables"]["main"]
    assert [(c["kind"], c.get("stream")) for c in only] == \
        [("compact", None), ("set tblproperties", None), ("run", "other")]
    assert "ev" not in {c.get("stream") for c in history(lake, "other")["tables"]["main"]}


# ---- compact ---------------------------------------------------------------------------------

def test_compact_keeps_rows_statistics_and_the_last_run(data_dir: Path, lake: Lake) -> None:
    for start in range(0, 60, 20):
        append(data_dir, start, 20)
        ship_in_process(data_dir, lake)
    main = LakeTable.main(lake)
    before = main.open()
    assert before is not None
    rows_before = sorted(entry_keys(read_table(lake, "ev")))
    app = Shipper("ev", _incarnation(data_dir), "spark-ship").app_id
    got = compact(lake, "ev")["tables"]
    assert got["main"]["files_removed"] > got["main"]["files_added"] >= 1
    after = main.open()
    assert after is not None
    assert len(after.file_uris()) < len(before.file_uris())
    assert sorted(entry_keys(read_table(lake, "ev"))) == rows_before
    adds = pa.table(after.get_add_actions(flatten=True))
    for column in ("min._comet_entry", "max._comet_entry", "min._comet_shard", "max._comet_time"):
        assert adds.column(column).null_count == 0, column
    assert main.committed_run(app) == 3  # the app transaction survives the compaction
    append(data_dir, 60, 20)
    assert ship_in_process(data_dir, lake).run == 4
    check_exactly_once(lake, data_dir, "ev", CFG)
    assert check(lake, str(data_dir)).ok


def test_compaction_beside_a_run_that_commits_meanwhile(data_dir: Path, lake: Lake,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The compaction has read the table; a run commits; the compaction commits after it."""
    from deltalake.table import TableOptimizer

    for start in (0, 20):
        append(data_dir, start, 20)
        ship_in_process(data_dir, lake)
    append(data_dir, 40, 20)
    real_compact = TableOptimizer.compact
    runs: list[int | None] = []

    def a_run_commits_first(self: TableOptimizer, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if self.table.table_uri.rstrip("/").endswith("lake") and not runs:
            runs.append(ship_in_process(data_dir, lake).run)  # commits the next version
        return real_compact(self, *args, **kwargs)

    monkeypatch.setattr(TableOptimizer, "compact", a_run_commits_first)
    got = compact(lake)["tables"]["main"]
    monkeypatch.undo()
    assert runs == [3]
    main = LakeTable.main(lake).open()
    assert main is not None
    last, before = main.history(2)
    assert (last["operation"], before["comet.run"]) == ("OPTIMIZE", "3")
    assert last["readVersion"] < before["version"]  # it read the table before the run's commit
    assert got["files_removed"] >= 2
    check_exactly_once(lake, data_dir, "ev", CFG)
    report = check(lake, str(data_dir))
    assert report.ok, report.problems


# ---- vacuum ----------------------------------------------------------------------------------

def test_vacuum_keeps_a_pending_runs_files_and_removes_a_dead_attempts(
        data_dir: Path, lake: Lake, monkeypatch: pytest.MonkeyPatch) -> None:
    append(data_dir, 0, 40)
    ship_in_process(data_dir, lake)
    append(data_dir, 40, 20)
    stop_at(monkeypatch, "spark_ship.written")
    with pytest.raises(RuntimeError, match="stopped at spark_ship.written"):
        ship_in_process(data_dir, lake)
    monkeypatch.undo()
    root = Path(lake.root)
    attempt = sorted(str(p.relative_to(root)) for p in root.glob("stream=ev/*/*/part-00000002-*"))
    assert attempt
    # an attempt that has been going on for two days: its plan and its files are that old
    shipper = Shipper("ev", _incarnation(data_dir), "spark-ship")
    plan_path = root / shipper.plan_rel(2)
    plan = json.loads(plan_path.read_bytes())
    plan["created"] = time.time() - 2 * DAY - 60
    plan_path.write_text(json.dumps(plan))
    _age(root, attempt, 2 * DAY)
    assert [rel for rel, _ in pending_plans(lake)] == [shipper.plan_rel(2)]
    dry = vacuum(lake, 24)
    assert dry["dry_run"] and dry["retention_hours"] >= 49
    assert dry["kept_for_runs"] == [shipper.plan_rel(2)] and dry["tables"]["main"]["files"] == []
    before = lake_files(root)
    assert vacuum(lake, 24, apply=True)["tables"]["main"]["count"] == 0
    assert {k: v for k, v in lake_files(root).items() if "_delta_log" not in k} == \
        {k: v for k, v in before.items() if "_delta_log" not in k}
    # the run is redone (another attempt, new files) and commits: the old attempt's are garbage
    ship_in_process(data_dir, lake)
    assert pending_plans(lake) == []
    dry = vacuum(lake, 24)
    assert dry["retention_hours"] == 24 and dry["tables"]["main"]["files"] == attempt
    assert all((root / f).exists() for f in attempt)  # a dry run deletes nothing
    assert vacuum(lake, 24, apply=True)["tables"]["main"]["files"] == attempt
    assert not any((root / f).exists() for f in attempt)
    check_exactly_once(lake, data_dir, "ev", CFG)
    assert check(lake, str(data_dir)).ok
    main = LakeTable.main(lake).open()
    assert main is not None
    assert [c["operation"] for c in main.history(2)] == ["VACUUM END", "VACUUM START"]


def _age(root: Path, rels: list[str], seconds: float) -> None:
    then = time.time() - seconds
    for rel in rels:
        os.utime(root / rel, (then, then))


def test_vacuum_keeps_what_compaction_replaced_within_the_retention(data_dir: Path, lake: Lake) -> None:
    for start in (0, 20):
        append(data_dir, start, 20)
        ship_in_process(data_dir, lake)
    root = Path(lake.root)
    old = sorted(str(p.relative_to(root)) for p in root.glob("stream=ev/*/*/*.parquet"))
    compact(lake)
    assert vacuum(lake, 24)["tables"]["main"]["files"] == []  # replaced just now: kept
    _age(root, old, 2 * DAY)  # old files, removed from the table just now: the removal's time counts
    assert vacuum(lake, 24)["tables"]["main"]["files"] == []
    assert set(old) <= set(lake_files(root))


# ---- check -----------------------------------------------------------------------------------

def test_check_passes_and_then_fails_on_a_deleted_file(data_dir: Path, lake: Lake) -> None:
    append(data_dir, 0, 40)
    ship_in_process(data_dir, lake)
    report = check(lake, str(data_dir))
    assert report.ok, report.problems
    assert report.streams[0]["entries"] == 40 and report.streams[0]["ranges"] == {"0": (0, 20), "1": (0, 20)}
    victim = sorted(Path(lake.root).glob("stream=ev/*/*/*.parquet"))[0]
    victim_rows = pq.read_metadata(victim).num_rows
    victim.unlink()
    report = check(lake)
    assert report.problems[0] == f"main: file {victim.relative_to(lake.root)} is missing"
    assert report.problems[1].endswith(f"its runs committed {40 - 6} rows, the main table has "
                                       f"{34 - victim_rows}")


def test_check_fails_on_a_duplicated_add(data_dir: Path, lake: Lake) -> None:
    from deltalake import CommitProperties
    from deltalake.transaction import AddAction

    append(data_dir, 0, 40)
    ship_in_process(data_dir, lake)
    main = LakeTable.main(lake)
    table = main.open()
    assert table is not None
    add = pa.table(table.get_add_actions(flatten=False)).to_pylist()[0]
    copy = add["path"].replace(".zstd.parquet", "-copy.zstd.parquet")
    shutil.copy(Path(lake.root) / add["path"], Path(lake.root) / copy)
    table.create_write_transaction(
        [AddAction(copy, add["size_bytes"], {k: str(v) for k, v in add["partition"].items()},
                   add["modification_time"], True, json.dumps({"numRecords": add["num_records"]}))],
        mode="append", schema=table.schema(), partition_by=["stream", "dt", "hour"],
        commit_properties=CommitProperties(custom_metadata={"who": "a hand"}))
    report = check(lake)
    assert not report.ok
    assert any("entries committed twice" in p for p in report.problems), report.problems


def test_check_fails_on_a_gap_and_on_a_group_acked_past_the_lake(data_dir: Path, lake: Lake) -> None:
    append(data_dir, 0, 40)
    ship_in_process(data_dir, lake)
    append(data_dir, 40, 20)
    with Log(data_dir, CFG) as log:
        log.group("ev", 0, "spark-ship").ack(24)  # someone else skipped entries 20..24 of shard 0
    ship_in_process(data_dir, lake)
    report = check(lake, str(data_dir))
    assert [p for p in report.problems if "gap" in p] == [
        f"{Shipper('ev', _incarnation(data_dir), 'spark-ship').app_id} shard 0: a gap between run 1 "
        "(ends at entry 20) and run 2 (starts at entry 25)"]
    append(data_dir, 60, 10)
    with Log(data_dir, CFG) as log:
        log.group("ev", 1, "spark-ship").ack(32)
    problems = check(lake, str(data_dir)).problems
    assert "stream 'ev' shard 1: group 'spark-ship' is acked up to entry 33, the lake's runs end at " \
        "entry 30: entries 30..32 are in no commit" in problems


def test_check_beside_a_run_between_its_two_commits(data_dir: Path, lake: Lake,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The rejects of a run whose main commit has not happened yet are not
    committed rows: a check then is clean."""
    append(data_dir, 0, 40)
    ship_in_process(data_dir, lake)
    append(data_dir, 40, 20)
    stop_at(monkeypatch, "spark_ship.committing")
    with pytest.raises(RuntimeError):
        ship_in_process(data_dir, lake)
    monkeypatch.undo()
    rejects = LakeTable.rejects(lake).open()
    assert rejects is not None and len(rejects.history()) == 2
    report = check(lake, str(data_dir))
    assert report.ok, report.problems
    assert report.tables["rejects"]["files_of_runs_not_committed"] >= 1


# ---- on S3 ---------------------------------------------------------------------------------

def test_the_commands_on_an_s3_lake(data_dir: Path, moto_s3: str, aws_env: None) -> None:
    """As processes of their own: delta-rs's history holds the GIL, which
    moto's server (a thread of this process) then waits for."""
    import boto3

    boto3.client("s3", endpoint_url=moto_s3).create_bucket(Bucket="edge")
    lake = Lake("s3://edge/lake", endpoint_url=moto_s3)
    for start in (0, 40):
        append(data_dir, start, 40)
        ship_in_process(data_dir, lake)
    env = dict(os.environ, AWS_ENDPOINT_URL=moto_s3)
    got = comet_lake("history", lake.url, env=env)
    assert got.returncode == 0, got.stderr
    assert [r["run"] for r in json.loads(got.stdout)["tables"]["main"]] == [2, 1]
    got = comet_lake("compact", lake.url, env=env)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["tables"]["main"]["files_removed"] >= 2
    got = comet_lake("vacuum", lake.url, env=env)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["tables"]["main"]["files"] == []  # replaced just now: kept
    got = comet_lake("check", lake.url, "--data-dir", data_dir, env=env)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["ok"] is True
    check_exactly_once(lake, data_dir, "ev", CFG)


# ---- the command line ------------------------------------------------------------------------

def test_the_command_line(data_dir: Path, lake: Lake) -> None:
    assert {"history", "compact", "vacuum", "check"} <= set(
        comet_lake("--help").stdout.split())
    append(data_dir, 0, 40)
    ship_in_process(data_dir, lake)
    got = comet_lake("history", lake.url, "--limit", "1")
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["tables"]["main"][0]["run"] == 1
    before = lake_files(Path(lake.root))
    bad = comet_lake("vacuum", lake.url, "--retention-hours", "1", "--apply")
    assert (bad.returncode, bad.stdout) == (1, "")
    assert bad.stderr.strip().splitlines() == [
        "Error: retention 1 hours: at least 24 (files a compaction has written and not yet "
        "committed, store clocks, readers of older versions)"]
    assert lake_files(Path(lake.root)) == before
    for args in (["convert", lake.url, "--data-dir", data_dir],
                 ["check", lake.url, "--data-dir", data_dir / "nope"],
                 ["compact", lake.url, "--target-size", "0"]):
        failed = comet_lake(*args)
        assert failed.returncode != 0 and failed.stderr.strip().splitlines()[-1].startswith("Error: "), args
    assert lake_files(Path(lake.root)) == before
    nothing = comet_lake("history", data_dir.parent / "no-lake")
    assert (nothing.returncode, nothing.stderr.strip()) == (
        1, f"Error: {data_dir.parent / 'no-lake'} has no Delta table (nothing shipped there yet?)")
    ok = comet_lake("check", lake.url, "--data-dir", data_dir)
    assert ok.returncode == 0 and json.loads(ok.stdout)["ok"] is True
    sorted(Path(lake.root).glob("stream=ev/*/*/*.parquet"))[0].unlink()
    damaged = comet_lake("check", lake.url)
    assert damaged.returncode == 1
    assert json.loads(damaged.stdout)["ok"] is False
    assert damaged.stderr.strip().splitlines()[-1].startswith("Error: the lake has 2 problems: main: file ")


def _incarnation(data_dir: Path) -> int:
    with Log(data_dir, Config.inspector()) as log:
        return log.stream_created_ns("ev")
