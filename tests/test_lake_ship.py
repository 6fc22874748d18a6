"""``comet spark-ship``'s protocol on the Delta lake, mostly without a JVM
(``tests/support/lake.py``'s ``in_process``: the real tasks, run here):
schema growth, stream incarnations, one run at a time, the commits, and
what other readers see."""

from __future__ import annotations

import json
import logging
import os
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from spark_jobs.spark import ship as ship_module
from spark_jobs.lake.delta import LakeTable, arrow_schema
from spark_jobs.lake.read import read_table
from spark_jobs.lake.lakefs import Lake
from spark_jobs.lake.lock import LakeBusy, run_lock
from spark_jobs.lake.plan import plan_runs, read_plan
from spark_jobs.spark.ship import ShipOptions, ShipReport, ship
from storage_c import Config, Log

from .support.lake import check_exactly_once, committed_runs, duckdb_table, in_process, shipper_of
from .support.storage import fill

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

CFG = Config(shards=4, segment_bytes=1 << 20)
HOUR_MS = 3_600_000
T0_MS = 1_763_700_000_000  # 2025-11-21T04:40Z


def put(data_dir: Path, values: list[Any], shard: int | None = None) -> None:
    """Appends JSON ``values`` (bytes as they are) to stream "ev" (4 shards), round robin or into ``shard``."""
    payloads = [v if isinstance(v, bytes) else orjson.dumps(v) for v in values]
    with Log(data_dir, CFG) as log:
        fill(log, "ev", payloads, shards=4, shard=shard, batch=1)


def run(data_dir: Path, lake: Lake, **kw: Any) -> ShipReport:
    """One ``comet spark-ship`` call, its tasks in this process."""
    return ship(ShipOptions(str(data_dir), "ev", lake, **kw), in_process)


def rows_by_id(lake: Lake) -> dict[int, dict[str, Any]]:
    return {r["id"]: r for r in read_table(lake, "ev").to_pylist()}


def group_offsets(data_dir: Path) -> list[int]:
    with Log(data_dir, CFG) as log:
        return [log.group("ev", s, "spark-ship", create=False).offset for s in range(4)]


class Killed(BaseException):
    """A run stopped dead at a crash point (in-process, as SIGKILL would there)."""


def crash_at(monkeypatch: pytest.MonkeyPatch, point: str) -> None:
    def cut_point(name: str) -> None:
        if name == point:
            raise Killed(name)

    monkeypatch.setattr(ship_module, "cut_point", cut_point)


# ---- schema growth ----------------------------------------------------------------------

def test_a_new_field_becomes_a_nullable_column_old_rows_null(data_dir: Path, tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"))
    put(data_dir, [{"id": i, "g": {"x": i}} for i in range(8)])
    assert run(data_dir, lake).run == 1
    put(data_dir, [{"id": 8 + i, "g": {"x": i, "y": f"y{i}"}, "temp": 20.5} for i in range(8)])
    second = run(data_dir, lake)
    assert (second.run, second.rows, second.rejects) == (2, 8, 0)
    assert second.new_columns == ["g", "temp"]  # g grew a child, temp is new
    table = LakeTable.main(lake).open()
    assert table is not None
    fields = {f.name: f for f in table.schema().fields}
    assert fields["temp"].nullable and fields["g"].nullable
    assert LakeTable.main(lake).value_type() == pa.struct(
        [("id", pa.int64()), ("g", pa.struct([("x", pa.int64()), ("y", pa.string())])),
         ("temp", pa.float64())])
    rows = rows_by_id(lake)
    assert (rows[3]["g"], rows[3]["temp"]) == ({"x": 3, "y": None}, None)  # written before: null
    assert (rows[11]["g"], rows[11]["temp"]) == ({"x": 3, "y": "y3"}, 20.5)
    check_exactly_once(lake, data_dir, "ev", CFG)


def test_long_then_double_within_a_run_is_double(data_dir: Path, tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """A new field met as long and as double in one run is a double column:
    across tasks (the task that wrote long runs again), within one task,
    and when the run's sample saw only longs."""
    lake = Lake(str(tmp_path / "lake"))
    put(data_dir, [{"id": 0}, {"id": 1, "v": 1.5}, {"id": 2, "v": 2}, {"id": 3, "v": 4}], shard=0)
    # the sample sees w as long; a reject between its values parts the task's parse
    put(data_dir, [{"id": 10, "w": 1}, b"oops", {"id": 11, "w": 2.5}], shard=1)
    caplog.set_level(logging.INFO, logger="comet.spark_ship")
    report = run(data_dir, lake, sample=2, entries_per_task=3)  # a sample of an entry a shard
    assert (report.rows, report.rejects) == (6, 1)
    assert LakeTable.main(lake).value_type() == pa.struct(
        [("id", pa.int64()), ("w", pa.float64()), ("v", pa.float64())])
    rows = rows_by_id(lake)
    assert {i: r["v"] for i, r in rows.items() if i < 10} == {0: None, 1: 1.5, 2: 2.0, 3: 4.0}
    assert (rows[10]["w"], rows[11]["w"]) == (1.0, 2.5)
    [rerun] = [getattr(r, "comet_fields") for r in caplog.records if r.msg == "tasks_rerun"]
    assert rerun["tasks"] == [0, 1]  # shard 0's: they wrote w (task 1 v too) as long
    check_exactly_once(lake, data_dir, "ev", CFG)


def test_a_value_of_another_type_than_its_column_is_a_reject_with_the_reason(
        data_dir: Path, tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"))
    put(data_dir, [{"id": i, "temp": 20.5} for i in range(4)], shard=0)
    run(data_dir, lake)
    put(data_dir, [{"id": 4, "temp": "hot"}, {"id": 5, "temp": 21}], shard=0)
    report = run(data_dir, lake)
    assert (report.run, report.rows, report.rejects, report.missing) == (2, 1, 1, 0)
    assert report.to_dict()["rejects"] == 1
    [reject] = read_table(lake, "ev", kind="rejects").to_pylist()
    assert (reject["shard"], reject["entry"], reject["value"]) == (0, 4, b'{"id":4,"temp":"hot"}')
    assert reject["error"] == "shard 0 entry 4: field 'temp' is string here, the lake's column is double"
    assert rows_by_id(lake)[5]["temp"] == 21.0  # JSON has one kind of number
    assert LakeTable.main(lake).value_type() == pa.struct([("id", pa.int64()), ("temp", pa.float64())])
    check_exactly_once(lake, data_dir, "ev", CFG)


def test_a_given_schema_fixes_the_columns(spark: SparkSession, data_dir: Path, tmp_path: Path) -> None:
    """--schema: Spark's parser reads it (hence the session), the tasks run here."""
    lake = Lake(str(tmp_path / "lake"))
    put(data_dir, [{"id": i, "device": "d", "extra": i} for i in range(8)])
    first = run(data_dir, lake, value_schema="id long, device string")
    assert (first.run, first.rows) == (1, 8)
    assert LakeTable.main(lake).value_type() == pa.struct([("id", pa.int64()), ("device", pa.string())])
    # A schema that changes a column's type: refused before the lake changes.
    put(data_dir, [{"id": 8 + i, "device": "d", "temp": 1.5} for i in range(8)])
    table = LakeTable.main(lake).open()
    assert table is not None
    version, offsets = table.version(), group_offsets(data_dir)
    plans = plan_runs(lake, shipper_of(data_dir, "ev", CFG))
    with pytest.raises(ValueError, match=r"^--schema changes the type of a column the lake has: "
                       r"id is long in the lake, string in the schema$"):
        run(data_dir, lake, value_schema="id string, device string, temp double")
    assert table.version() == LakeTable.main(lake).open().version() == version  # type: ignore[union-attr]
    assert (group_offsets(data_dir), plan_runs(lake, shipper_of(data_dir, "ev", CFG))) == (offsets, plans)
    # One that adds a column: a new nullable column, like a new field.
    second = run(data_dir, lake, value_schema="id long, temp double")
    assert (second.run, second.rows, second.new_columns) == (2, 8, ["temp"])
    rows = rows_by_id(lake)
    assert (rows[1]["temp"], rows[9]["temp"], rows[9]["device"]) == (None, 1.5, None)
    assert "extra" not in rows[1]
    check_exactly_once(lake, data_dir, "ev", CFG)


def test_the_event_time_field_picks_the_partition(data_dir: Path, tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"))
    put(data_dir, [{"id": 0, "at": T0_MS}, {"id": 1, "at": T0_MS + 3 * HOUR_MS}, {"id": 2}], shard=0)
    assert run(data_dir, lake, event_time_field="at").rows == 3
    rows = rows_by_id(lake)

    def partition(ms: int) -> tuple[str, int]:
        at = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
        return f"{at:%Y-%m-%d}", at.hour

    assert (rows[0]["dt"], rows[0]["hour"]) == partition(T0_MS) == ("2025-11-21", 4)
    assert (rows[1]["dt"], rows[1]["hour"]) == partition(T0_MS + 3 * HOUR_MS)
    appended = rows[2]["_comet_time"]  # no event time: the entry's append time
    assert (rows[2]["dt"], rows[2]["hour"]) == (f"{appended:%Y-%m-%d}", appended.hour)
    # Text is a string column (no timestamp guessing): give such a field in --schema.
    put(data_dir, [{"id": 3, "note": "2025-11-21T04:40:00Z"}])
    other = Lake(str(tmp_path / "other"))
    with pytest.raises(ValueError, match=r"^event time field 'note' is string: give it as timestamp"):
        run(data_dir, other, event_time_field="note")
    assert LakeTable.main(other).open() is None


# ---- stream incarnations ----------------------------------------------------------------

def test_a_recreated_stream_ships_from_entry_0_and_the_old_rows_stay(data_dir: Path, tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"))
    put(data_dir, [{"id": i, "life": 1} for i in range(12)])
    old = shipper_of(data_dir, "ev", CFG)
    assert run(data_dir, lake).run == 1
    before = read_table(lake, "ev").sort_by([("_comet_shard", "ascending"), ("_comet_entry", "ascending")])
    with Log(data_dir, CFG) as log:
        log.delete_stream("ev")
    put(data_dir, [{"id": 100 + i, "life": 2} for i in range(6)])  # entries 0.. again
    new = shipper_of(data_dir, "ev", CFG)
    assert new.app_id != old.app_id
    report = run(data_dir, lake)
    assert (report.run, report.rows) == (1, 6)  # the new incarnation's first run
    rows = read_table(lake, "ev").sort_by([("_comet_shard", "ascending"), ("_comet_entry", "ascending")])
    lives = rows.column("life").to_pylist()
    old_rows = rows.filter(pa.array([life == 1 for life in lives]))
    assert old_rows.to_pylist() == before.to_pylist()  # untouched
    new_rows = rows.filter(pa.array([life == 2 for life in lives])).to_pylist()
    assert sorted(r["id"] for r in new_rows) == list(range(100, 106))
    with Log(data_dir, CFG) as log:
        ends = [log.shard_stats("ev", s).next_entry for s in range(4)]
    assert sum(ends) == 6
    assert sorted((r["_comet_shard"], r["_comet_entry"]) for r in new_rows) == \
        [(s, e) for s in range(4) for e in range(ends[s])]  # from entry 0
    assert group_offsets(data_dir) == ends
    table = LakeTable.main(lake).open()
    assert table is not None
    assert (table.transaction_version(old.app_id), table.transaction_version(new.app_id)) == (1, 1)


# ---- one run at a time ------------------------------------------------------------------

def test_a_second_run_is_refused_while_one_holds_the_lock(data_dir: Path, tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"))
    put(data_dir, [{"id": i} for i in range(8)])
    assert run(data_dir, lake).run == 1
    put(data_dir, [{"id": 8 + i} for i in range(8)])
    table = LakeTable.main(lake).open()
    assert table is not None
    shipper = shipper_of(data_dir, "ev", CFG)
    version, offsets, plans = table.version(), group_offsets(data_dir), plan_runs(lake, shipper)
    with run_lock(lake, "ev", "spark-ship"):  # as a run in progress holds it
        with pytest.raises(LakeBusy) as busy:
            run(data_dir, lake)
        # another group is another shipper: not held up
        assert ship(ShipOptions(str(data_dir), "ev", lake, group="audit"), in_process).run == 1
    assert str(busy.value).startswith(f"another comet spark-ship (pid {os.getpid()} on "
                                      f"{socket.gethostname()}, since ")
    assert str(busy.value).endswith(f") is shipping stream 'ev' with group 'spark-ship' into "
                                    f"{lake.url}: one run at a time; this one changed nothing")
    assert (group_offsets(data_dir), plan_runs(lake, shipper)) == (offsets, plans)
    assert LakeTable.main(lake).committed_run(shipper.app_id) == 1
    assert committed_runs(lake) == [1, 1]  # ours, and the audit group's first
    assert version + 1 == LakeTable.main(lake).open().version()  # type: ignore[union-attr]
    assert run(data_dir, lake).run == 2  # once the lock is free


# ---- the commits ------------------------------------------------------------------------

def test_a_run_is_one_commit_per_table_with_its_app_transaction_and_stats(
        data_dir: Path, tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"))
    put(data_dir, [{"id": i} for i in range(40)] + [b"not json"])
    first = run(data_dir, lake, entries_per_task=4)
    put(data_dir, [{"id": 100 + i} for i in range(12)])
    second = run(data_dir, lake, entries_per_task=4)
    assert (first.rejects, second.rejects) == (1, 0)
    shipper = shipper_of(data_dir, "ev", CFG)
    main, rejects = LakeTable.main(lake).open(), LakeTable.rejects(lake).open()
    assert main is not None and rejects is not None
    assert (main.transaction_version(shipper.app_id), rejects.transaction_version(shipper.app_id)) == (2, 1)
    assert (committed_runs(lake), committed_runs(lake, "rejects")) == ([1, 2], [1])
    [commit] = [c for c in main.history() if c.get("comet.run") == "2"]
    plan = read_plan(lake, shipper, 2)
    assert plan is not None
    assert json.loads(commit["comet.ranges"]) == {str(s): [a, b] for s, (a, b) in plan.ranges.items()}
    assert (commit["comet.app"], commit["comet.group"], commit["comet.stream"]) == \
        (shipper.app_id, "spark-ship", "ev")
    assert (commit["comet.incarnation"], commit["comet.rows"], commit["comet.rejects"]) == \
        (str(shipper.incarnation), "12", "0")
    # Each file's statistics (what lets a reader skip it) are those of its rows.
    actions = pa.table(main.get_add_actions(flatten=True)).to_pylist()
    assert len(actions) == first.files - 1 + second.files  # the reject's file is in the other table
    for action in actions:
        data = pq.read_table(os.path.join(lake.root, action["path"]))
        lo, hi = pc.min_max(data.column("_comet_entry")).values()
        assert action["num_records"] == data.num_rows
        assert (action["min._comet_entry"], action["max._comet_entry"]) == (lo.as_py(), hi.as_py())
        assert action["min._comet_shard"] == action["max._comet_shard"] == data.column("_comet_shard")[0].as_py()
    check_exactly_once(lake, data_dir, "ev", CFG)


def test_an_entry_that_is_no_json_object_is_a_reject_saying_what_it_is(data_dir: Path,
                                                                     tmp_path: Path) -> None:
    """A bare 42 (or any JSON that is no object) is refused as such, not with
    the JSON parser's words ("Column() changed from object to number")."""
    lake = Lake(str(tmp_path / "lake"))
    bad = {b"42": "not a JSON object but a number", b'"text"': "not a JSON object but a string",
           b"[1, 2]": "not a JSON object but an array", b"null": "not a JSON object but null",
           b"true": "not a JSON object but a boolean", b"3.5e2": "not a JSON object but a number",
           b"not json": "not JSON: ", b'{"a": 1} {"b": 2}': "not JSON: "}
    put(data_dir, [{"id": 0}, *bad, {"id": 9}], shard=0)
    report = run(data_dir, lake)
    assert (report.rows, report.rejects) == (2, len(bad))
    rejects = sorted(read_table(lake, "ev", kind="rejects").to_pylist(), key=lambda r: r["entry"])
    for n, (reject, (value, says)) in enumerate(zip(rejects, bad.items()), 1):
        assert reject["value"] == value and reject["error"].startswith(f"shard 0 entry {n}: {says}"), reject
        assert "changed from object" not in reject["error"], reject


def test_the_rejects_table_exists_empty_from_the_first_run(data_dir: Path, tmp_path: Path) -> None:
    """Readers are told to read <lake>/_rejects: a first run without a reject
    creates it, empty, and a later run's rejects commit to it as usual."""
    import polars

    lake = Lake(str(tmp_path / "lake"))
    put(data_dir, [{"id": i} for i in range(8)])
    assert run(data_dir, lake).rejects == 0
    rejects = LakeTable.rejects(lake).open()
    assert rejects is not None and rejects.version() == 0
    assert polars.read_delta(lake.path("_rejects")).height == 0
    assert duckdb_table(lake.path("_rejects")).num_rows == 0
    assert read_table(lake, "ev", kind="rejects").num_rows == 0
    assert [f.name for f in arrow_schema(rejects)] == \
        ["shard", "entry", "timestamp", "value", "error", "stream", "dt", "hour"]
    put(data_dir, [{"id": 8}, b"42"])
    assert run(data_dir, lake).rejects == 1
    assert committed_runs(lake, "rejects") == [2]
    check_exactly_once(lake, data_dir, "ev", CFG)


def test_a_crash_between_the_two_commits_commits_each_table_once(
        data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rejects table commits first; a run killed before the main
    table's commit is redone, and the rejects' commit is not made again."""
    lake = Lake(str(tmp_path / "lake"))
    put(data_dir, [{"id": i} for i in range(20)] + [b"bad one", b"bad two"])
    crash_at(monkeypatch, "spark_ship.committing")
    with pytest.raises(Killed):
        run(data_dir, lake)
    monkeypatch.undo()
    assert (committed_runs(lake, "rejects"), committed_runs(lake)) == ([1], [])
    offsets = group_offsets(data_dir)
    assert offsets == [0, 0, 0, 0]  # nothing acked
    report = run(data_dir, lake)
    assert (report.resumed, report.run, report.rows, report.rejects) == (1, 1, 20, 2)
    assert (committed_runs(lake, "rejects"), committed_runs(lake)) == ([1], [1])
    _, rejects = check_exactly_once(lake, data_dir, "ev", CFG)
    assert rejects.num_rows == 2 and set(rejects.column("value").to_pylist()) == {b"bad one", b"bad two"}


# ---- other readers ----------------------------------------------------------------------

def test_deltalake_polars_and_duckdb_read_the_same_rows(data_dir: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import polars

    lake = Lake(str(tmp_path / "lake"))
    put(data_dir, [{"id": i, "g": {"x": i}} for i in range(30)] + [b"[1]"])
    run(data_dir, lake, entries_per_task=5)
    put(data_dir, [{"id": 30 + i, "g": {"x": i, "y": "y"}, "temp": 1.5} for i in range(30)])
    run(data_dir, lake, entries_per_task=5)  # the schema grew
    put(data_dir, [{"id": 60 + i} for i in range(30)])
    crash_at(monkeypatch, "spark_ship.written")  # run 3's files, in no commit
    with pytest.raises(Killed):
        run(data_dir, lake, entries_per_task=5)
    monkeypatch.undo()

    def read_by_all(expect: int) -> None:
        key = ["_comet_shard", "_comet_entry"]
        reads = {
            "deltalake": read_table(lake).select([*key, "id", "temp", "stream", "hour"]),
            "polars": polars.read_delta(lake.root).select([*key, "id", "temp", "stream", "hour"]).to_arrow(),
            "duckdb": duckdb_table(lake.root, "select _comet_shard, _comet_entry, id, temp, stream, hour "
                                              "from delta_scan('{root}')"),
        }
        seen = {name: sorted(tuple(r.values()) for r in t.to_pylist()) for name, t in reads.items()}
        assert len(seen["deltalake"]) == expect
        assert len({tuple(r[:2]) for r in seen["deltalake"]}) == expect  # each entry once
        assert seen["polars"] == seen["deltalake"] == seen["duckdb"]
        rejects = {"deltalake": read_table(lake, kind="rejects").select(["shard", "entry"]).to_pylist(),
                   "polars": polars.read_delta(lake.path("_rejects")).select(["shard", "entry"]).to_dicts(),
                   "duckdb": duckdb_table(lake.path("_rejects"), "select shard, entry from "
                                                                 "delta_scan('{root}')").to_pylist()}
        assert [len(r) for r in rejects.values()] == [1, 1, 1]
        assert rejects["deltalake"] == rejects["polars"] == rejects["duckdb"]

    read_by_all(60)  # runs 1 and 2 only
    run(data_dir, lake, entries_per_task=5)
    read_by_all(90)
    check_exactly_once(lake, data_dir, "ev", CFG)
