"""``comet spark-ship``: the log into a Delta Lake table, exactly once, with Spark.

The protocol's finer points (schema growth, incarnations, the lock, the
commits, other readers) are tested without a JVM in tests/test_lake_ship.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pytest

from storage_c import Config, Log
from spark_jobs.spark import ship as ship_module
from spark_jobs.lake.delta import LakeTable
from spark_jobs.lake.read import read_dataframe, read_table
from spark_jobs.lake.lakefs import Lake, LakeError
from spark_jobs.lake.plan import plan_runs
from spark_jobs.spark.ship import ShipOptions, ship

from .support.lake import check_exactly_once, committed_files, committed_runs, shipper_of
from .support.processes import REPO
from .support.server import COMET
from .support.storage import fill, read_all

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

CFG = Config(shards=4, segment_bytes=1 << 20, compression_threshold=512)
HOUR_MS = 3_600_000
T0_MS = 1_763_700_000_000  # 2025-11-21T04:40Z


def events(n: int, start: int = 0) -> list[bytes]:
    """Events whose event time walks over several hours; some are large (compressed)."""
    return [orjson.dumps({"id": i, "device": f"dev-{i % 5}", "temp": 20.0 + i % 10,
                          "at": T0_MS + i * 37_000, "note": "n" * (i % 900)})
            for i in range(start, start + n)]


def log_events(data_dir: Path) -> dict[tuple[int, int], Any]:
    """(shard, entry) -> event, for every entry of the stream."""
    out: dict[tuple[int, int], Any] = {}
    with Log(data_dir, CFG) as log:
        for shard in range(log.shard_count("ev")):
            for entry, _, payload in read_all(log, "ev", shard):
                out[(shard, entry)] = orjson.loads(payload) if payload.startswith(b"{") else payload
    return out


def lake_rows(lake: Lake) -> list[dict[str, Any]]:
    return read_table(lake, "ev").to_pylist()


def check_lake(lake: Lake, data_dir: Path, group: str = "spark-ship") -> None:
    """A Delta reader sees every entry exactly once (a row, or a reject),
    each row in the right hour, no temporary file is left, and the group's
    offsets are at the end of the log."""
    rows, _ = check_exactly_once(lake, data_dir, "ev", CFG, group)
    events = log_events(data_dir)
    for r in rows.to_pylist():
        event = events[(r["_comet_shard"], r["_comet_entry"])]
        assert (r["id"], r["device"], r["temp"]) == (event["id"], event["device"], event["temp"])
        hour = datetime.fromtimestamp(event["at"] / 1000, tz=timezone.utc)
        assert (r["stream"], r["dt"], r["hour"]) == ("ev", f"{hour:%Y-%m-%d}", hour.hour)
    assert leftovers(lake) == []


def leftovers(lake: Lake) -> list[str]:
    """Temporary files anywhere in the lake, and the tasks' files under
    ``_comet/tmp`` (none once a run is done)."""
    import pyarrow.fs as pafs

    selector = pafs.FileSelector(lake.root, recursive=True, allow_not_found=True)
    return sorted(i.path[len(lake.root) + 1:] for i in lake.fs.get_file_info(selector)
                  if i.type == pafs.FileType.File
                  and (i.path.endswith(".tmp") or "/_comet/tmp/" in i.path))


def options(data_dir: Path, lake: Lake, **kw: Any) -> ShipOptions:
    kw.setdefault("event_time_field", "at")
    return ShipOptions(str(data_dir), "ev", lake, **kw)


def test_ship_to_a_local_lake(spark: SparkSession, data_dir: Path, tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"))
    with Log(data_dir, CFG) as log:
        fill(log, "ev", events(3000), batch=1)
    first = ship(options(data_dir, lake), lambda: spark)  # schema inferred from a sample
    assert (first.run, first.rows, first.rejects, first.missing) == (1, 3000, 0, 0)
    check_lake(lake, data_dir)
    # The group the first run registered is one the comet source may start from.
    behind = (spark.read.format("comet").option("path", str(data_dir)).option("stream", "ev")
              .option("startingOffsets", "group:spark-ship").load())
    assert behind.count() == 0
    assert ship(options(data_dir, lake), lambda: spark).run is None  # nothing new: no run
    with Log(data_dir, CFG) as log:
        fill(log, "ev", events(500, start=3000), batch=1)
    second = ship(options(data_dir, lake), lambda: spark)
    assert (second.run, second.rows) == (2, 500)
    check_lake(lake, data_dir)
    assert committed_runs(lake) == [1, 2]  # a commit per run
    # The recipe for Spark without the Delta jars: the committed rows, with the partition columns.
    df = read_dataframe(spark, lake, "ev")
    assert df.count() == 3500
    assert {"id", "device", "stream", "dt", "hour", "_comet_entry"} <= set(df.columns)
    assert all(f.startswith("stream=ev/dt=") for f in committed_files(lake))


def test_ship_to_s3(spark: SparkSession, data_dir: Path, moto_s3: str, aws_env: None) -> None:
    import boto3

    boto3.client("s3", endpoint_url=moto_s3).create_bucket(Bucket="edge")
    lake = Lake("s3://edge/lake", endpoint_url=moto_s3, access_key="test", secret_key="test")
    with Log(data_dir, CFG) as log:
        fill(log, "ev", events(2000), batch=1)
    report = ship(options(data_dir, lake, value_schema="id long, device string, temp double, "
                                 "at long, note string", max_entries=1200), lambda: spark)
    assert (report.run, report.rows) == (1, 1200)  # bounded run
    # What an attempt killed before its commit leaves: a whole Parquet file
    # under a final name (here a copy of a committed one, rows and all).
    s3 = boto3.client("s3", endpoint_url=moto_s3)
    committed = committed_files(lake)[0]
    stray = f"lake/{committed.rsplit('/', 1)[0]}/part-00000002-00000-001-0123456789ab.zstd.parquet"
    s3.copy_object(Bucket="edge", Key=stray, CopySource={"Bucket": "edge", "Key": f"lake/{committed}"})
    report = ship(options(data_dir, lake), lambda: spark)  # the rest, with the lake's schema
    assert (report.run, report.rows) == (2, 800)
    check_lake(lake, data_dir)  # the stray copy is in no commit: no reader sees its rows
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="edge", Prefix="lake/")["Contents"]]
    assert stray in keys  # until `comet lake vacuum`
    assert not [k for k in keys if k.startswith("lake/_comet/locks/")]  # the run's lock is released
    assert any(k.startswith("lake/stream=ev/dt=2025-11-21/hour=") for k in keys)
    # A commit per run.  (Not through DeltaTable.history(): deltalake 1.6 holds
    # the GIL in it, and this test's S3 server is a thread of this process.)
    assert [k for k in keys if k.startswith("lake/_delta_log/")] == \
        [f"lake/_delta_log/{v:020d}.json" for v in (0, 1)]
    assert LakeTable.main(lake).committed_run(shipper_of(data_dir, "ev", CFG).app_id) == 2


def test_rejects_keep_bad_entries_and_lose_nothing(spark: SparkSession, data_dir: Path, tmp_path: Path) -> None:
    import pandas  # type: ignore[import-untyped]  # the dev dependencies have no pandas-stubs
    import polars

    lake = Lake(str(tmp_path / "lake"))
    with Log(data_dir, CFG) as log:
        fill(log, "ev", events(400), batch=1)
        bad = {log.append("ev", b"\xff not json", shard=1), log.append("ev", b'{"id": "x"}', shard=2),
               log.append("ev", b"[1, 2]", shard=3)}
        fill(log, "ev", events(100, start=400), batch=1)
    report = ship(options(data_dir, lake, value_schema="id long, device string, temp double, "
                                 "at long"), lambda: spark)
    assert (report.rows, report.rejects, report.missing) == (500, 3, 0)
    rows, rejects = check_exactly_once(lake, data_dir, "ev", CFG)  # acked past the rejects too
    assert rows.num_rows == 500
    by_entry = {(r["shard"], r["entry"]): r for r in rejects.to_pylist()}
    assert set(by_entry) == bad
    assert {r["value"] for r in by_entry.values()} == {b"\xff not json", b'{"id": "x"}', b"[1, 2]"}
    for (shard, entry), r in by_entry.items():  # the reason names the entry, not a batch's row
        assert r["error"].startswith(f"shard {shard} entry {entry}: ") and r["stream"] == "ev", r
        assert " in row " not in r["error"], r
    assert by_entry[2, min(e for s, e in bad if s == 2)]["error"].endswith(
        "field 'id' is string here, the lake's column is long")
    # Plain readers read the rejects as they read the lake: the partition
    # columns are in the paths only, once.
    for frame in (pandas.read_parquet(tmp_path / "lake" / "_rejects"),
                  polars.read_delta(str(tmp_path / "lake" / "_rejects")).to_pandas()):
        assert {(int(s), int(e)) for s, e in zip(frame["shard"], frame["entry"])} == bad
        assert set(frame["stream"].astype(str)) == {"ev"}
    assert len(pandas.read_parquet(tmp_path / "lake")) == 500


def test_clear_errors_and_nothing_acked(spark: SparkSession, data_dir: Path, tmp_path: Path, aws_env: None) -> None:
    with Log(data_dir, CFG) as log:
        fill(log, "ev", events(50), batch=1)
    lake = Lake(str(tmp_path / "lake"))
    with pytest.raises(ValueError, match="stream 'nope' does not exist"):
        ship(ShipOptions(str(data_dir), "nope", lake), no_spark)
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(LakeError, match="file is not a directory"):
        ship(options(data_dir, Lake(str(tmp_path / "file" / "lake"))), no_spark)
    with pytest.raises(ValueError) as bad_ddl:
        ship(options(data_dir, lake, value_schema="id lon g,,"), lambda: spark)
    message = str(bad_ddl.value)  # one line: the DDL and Spark's reason, no JVM stack
    assert message.startswith("value schema 'id lon g,,' is not valid Spark DDL: "
                              "[PARSE_SYNTAX_ERROR] Syntax error at or near 'g'"), message
    assert "\n" not in message
    with pytest.raises(ValueError, match=r"not valid Spark DDL: \[UNSUPPORTED_DATATYPE\] "
                       r"Unsupported data type \"STRIN\""):
        ship(options(data_dir, lake, value_schema="id long, device strin"), lambda: spark)
    with pytest.raises(ValueError, match="event time field 'when' is not in the value schema"):
        ship(options(data_dir, lake, value_schema="id long", event_time_field="when"), lambda: spark)
    with pytest.raises(ValueError, match="_comet_"):
        ship(options(data_dir, lake, value_schema="_comet_entry long"), lambda: spark)
    with pytest.raises(LakeError, match="use a local path or s3://"):
        Lake("ftp://x/y")
    closed = socket_port()
    unreachable = Lake("s3://edge/lake", endpoint_url=f"http://127.0.0.1:{closed}")
    started = time.monotonic()
    with pytest.raises(LakeError, match="not reachable"):
        ship(options(data_dir, unreachable), lambda: spark)
    assert time.monotonic() - started < 60
    assert not (tmp_path / "lake").exists()  # refused before anything was written
    with Log(data_dir, CFG) as log:
        assert log.groups("ev") == []  # nothing registered, nothing acked


def no_spark() -> SparkSession:
    raise AssertionError("Spark was started")


def test_nothing_new_needs_no_spark_and_the_time_includes_spark_start(
        spark: SparkSession, data_dir: Path, tmp_path: Path) -> None:
    """A run starts Spark only for work, and its reported time counts Spark's start."""
    lake = Lake(str(tmp_path / "lake"))
    with Log(data_dir, CFG) as log:
        fill(log, "ev", events(100), batch=1)

    def slow_start() -> SparkSession:
        time.sleep(1.5)  # as a JVM starting
        return spark

    started = time.monotonic()
    report = ship(options(data_dir, lake), slow_start)
    wall = time.monotonic() - started
    assert report.rows == 100
    assert wall - 0.25 <= report.seconds <= wall  # all of it, Spark's start included
    nothing = ship(options(data_dir, lake), no_spark)
    assert (nothing.run, nothing.rows, nothing.acked) == (None, 0, {})
    assert nothing.seconds < 1.0


def test_local_lake_paths_are_absolute_before_executors_see_them(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """An executor on a cluster runs in its own working directory: the Lake
    (and the source's path) it gets must already be absolute."""
    import pickle

    import pyarrow as pa
    from pyspark import cloudpickle

    from spark_jobs.spark.offsets import SourceOptions
    from spark_jobs.spark.writer import ShipTask

    driver, executor = tmp_path / "driver", tmp_path / "executor"
    driver.mkdir()
    executor.mkdir()
    monkeypatch.chdir(driver)
    cases = {"lake": (str(driver / "lake"), str(driver / "lake")),
             "./x/../lake/": (str(driver / "lake"), str(driver / "lake")),
             str(tmp_path / "abs"): (str(tmp_path / "abs"), str(tmp_path / "abs")),
             "file:rel": (f"file://{driver}/rel", str(driver / "rel")),
             f"file://{tmp_path}/abs": (f"file://{tmp_path}/abs", str(tmp_path / "abs"))}
    shipped = {}
    for given, (url, root) in cases.items():
        lake = Lake(given)
        assert (lake.url, lake.root) == (url, root), given
        task = ShipTask(str(driver / "data"), lake, "ev", 1, "attempt", "_comet/tmp/ev/g", pa.struct([]))
        shipped[given] = (pickle.dumps(lake), cloudpickle.dumps(task))
    s3 = Lake("s3://bucket/some/prefix/")
    assert (s3.url, s3.root) == ("s3://bucket/some/prefix/", "bucket/some/prefix")
    options = SourceOptions.parse({"path": "data", "stream": "ev"})
    assert options.path == str(driver / "data")
    monkeypatch.chdir(executor)
    for given, (url, root) in cases.items():
        lake_bytes, task_bytes = shipped[given]
        assert pickle.loads(lake_bytes).root == root
        assert cloudpickle.loads(task_bytes).lake.path("stream=ev") == f"{root}/stream=ev"
    assert pickle.loads(pickle.dumps(s3)).root == "bucket/some/prefix"
    assert pickle.loads(pickle.dumps(options)).path == str(driver / "data")


def killed_writer(target: Path) -> Path:
    """A real process killed with SIGKILL inside the lake's document write,
    after its temporary file and before the rename: what a spark-ship driver
    killed at that moment leaves.  The temporary file's path."""
    code = ("import os, sys, time\n"
            "from pathlib import Path\n"
            "from comet.files import write_durably\n"
            "def held(*args):\n"
            "    print('written', flush=True)\n"
            "    time.sleep(600)\n"
            "os.replace = held\n"
            "write_durably(Path(sys.argv[1]), b'{}')\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(target)], stdout=subprocess.PIPE,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"written\n"
    finally:
        proc.kill()
        proc.wait()
    temp = target.with_name(f".{target.name}.{proc.pid}.tmp")
    assert temp.is_file()
    return temp


def test_a_run_removes_what_killed_runs_left(spark: SparkSession, data_dir: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    lake_dir = tmp_path / "lake"
    lake = Lake(str(lake_dir))
    with Log(data_dir, CFG) as log:
        fill(log, "ev", events(1200), batch=1)
    assert ship(options(data_dir, lake, entries_per_task=200), lambda: spark).run == 1
    with Log(data_dir, CFG) as log:
        fill(log, "ev", events(1200, start=1200), batch=1)

    # Run 2 stops dead once its files are written (in-process, as a SIGKILL
    # there would): its plan, and its Parquet files under their final names.
    class Killed(BaseException):
        pass

    def cut_point(name: str) -> None:
        if name == "spark_ship.written":
            raise Killed(name)

    monkeypatch.setattr(ship_module, "cut_point", cut_point)
    with pytest.raises(Killed):
        ship(options(data_dir, lake, entries_per_task=200), lambda: spark)
    monkeypatch.undo()
    shipper = shipper_of(data_dir, "ev", CFG)
    assert (plan_runs(lake, shipper), committed_runs(lake)) == ([1, 2], [1])
    uncommitted = sorted(lake_dir.glob("stream=ev/*/*/part-00000002-*.parquet"))
    assert uncommitted  # in no commit: a Delta reader does not see them
    assert len(lake_rows(lake)) == 1200
    plans = lake_dir / shipper.plans_dir
    # Killed inside a plan's write (a real process, SIGKILL): its temporary file.
    dead = killed_writer(plans / "00000003.json")
    # A task's temporary file, left by an executor killed while writing it.
    dead_pid = dead.name.split(".")[-2]
    task_temp = lake_dir / "_comet" / "tmp" / "ev" / "spark-ship" / f"part-x.parquet.{dead_pid}.tmp"
    task_temp.parent.mkdir(parents=True, exist_ok=True)
    task_temp.write_bytes(b"PAR1")
    # A live writer's temporary plan is kept (the rule of comet.files,
    # tests/test_temp_files.py); the tasks' directory is the run's own, under its lock.
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        busy = plans / f".00000009.json.{live.pid}.tmp"
        busy.write_bytes(b"{")
        report = ship(options(data_dir, lake, entries_per_task=200), lambda: spark)
        assert (report.resumed, report.run, report.rows) == (2, 2, 1200)
        assert leftovers(lake) == [str(busy.relative_to(lake_dir))]
        assert not dead.exists() and not task_temp.exists()
    finally:
        live.kill()
        live.wait()
    assert ship(options(data_dir, lake), no_spark).run is None  # nothing new: no lock, no cleaning
    with Log(data_dir, CFG) as log:
        fill(log, "ev", events(100, start=2400), batch=1)
    assert ship(options(data_dir, lake), lambda: spark).run == 3  # the writer is gone: its file too
    check_lake(lake, data_dir)  # exactly once through Delta, and no temporary file left
    assert committed_runs(lake) == [1, 2, 3]
    assert all(p.exists() for p in uncommitted)  # until `comet lake vacuum`


def test_a_bad_schema_is_one_line_and_starts_no_python_worker(data_dir: Path, tmp_path: Path) -> None:
    """The real command with a typo in --schema: Spark's own parser refuses
    it before any job, so no Python worker exists to print anything as Spark
    stops: stderr is exactly the one line, at the default log level, and
    nothing is written."""
    with Log(data_dir, CFG) as log:
        fill(log, "ev", events(300), batch=1)
    workers = tmp_path / "python-workers"  # a line per Python worker Spark starts
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\necho \"$@\" >> {workers}\nexec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    env = dict(os.environ, PYSPARK_PYTHON=str(python))
    for name in ("COMET_CUT_POINT", "SPARK_LOCAL_IP", "COMET_SPARK_LOG_LEVEL"):
        env.pop(name, None)  # the default log level, as a user has it
    bad = subprocess.run([str(COMET), "spark-ship", str(data_dir), "ev", str(tmp_path / "lake"),
                          "--event-time-field", "at", "--schema", "id lon g,,", "--master", "local[1]"],
                         env=env, capture_output=True, text=True, timeout=240)
    assert (bad.returncode, bad.stdout) == (1, ""), bad.stderr
    assert bad.stderr == ("Error: value schema 'id lon g,,' is not valid Spark DDL: "
                          "[PARSE_SYNTAX_ERROR] Syntax error at or near 'g'. SQLSTATE: 42601 "
                          "(line 1, pos 7)\n"), bad.stderr
    assert not workers.exists(), workers.read_text()
    assert not (tmp_path / "lake").exists()  # refused before anything was written
    with Log(data_dir, CFG) as log:
        assert log.groups("ev") == []


def test_the_command_with_relative_paths(data_dir: Path, tmp_path: Path) -> None:
    """The real command from another working directory, with relative data and
    lake paths, on Spark's local-cluster master: a master and a worker in the
    driver's JVM, the executor a JVM of its own working in the worker's
    application directory, as on a cluster.  Every line it writes on stderr
    is a JSON object."""
    import pyspark

    with Log(data_dir, CFG) as log:
        fill(log, "ev", events(300), batch=1)
    work = tmp_path / "work"
    work.mkdir()
    # local-cluster's worker puts the executors' directories under
    # $SPARK_HOME/work: a SPARK_HOME of links to pyspark's, so they land here.
    spark_home = tmp_path / "spark-home"
    spark_home.mkdir()
    for name in ("bin", "jars", "python", "sbin"):
        (spark_home / name).symlink_to(Path(pyspark.__file__).parent / name)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1",
               SPARK_HOME=str(spark_home))
    for name in ("COMET_CUT_POINT", "COMET_SPARK_LOG_LEVEL"):  # the default level: WARN
        env.pop(name, None)
    command = [str(COMET), "spark-ship", os.path.relpath(data_dir, work), "ev", "lake",
               "--event-time-field", "at", "--master", "local-cluster[1,1,1024]"]
    good = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert good.returncode == 0, good.stderr
    assert orjson.loads(good.stdout)["rows"] == 300
    lines = [orjson.loads(line) for line in good.stderr.splitlines()]
    ours = [line["event"] for line in lines if line.get("logger") == "comet.spark_ship"]
    assert ours == ["run_start", "done"], good.stderr
    assert all({"ts", "level", "logger"} <= line.keys() for line in lines)
    check_lake(Lake(str(work / "lake")), data_dir)
    executor_dirs = [d for d in (spark_home / "work").glob("app-*/*") if d.is_dir()]
    assert executor_dirs  # the executor did run elsewhere, and wrote nothing there
    assert not [p for d in executor_dirs for p in d.rglob("*.parquet*")]


def fake_java(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose ``java`` only records that it was started (and
    fails): a run that starts Spark's JVM leaves the record."""
    home, record = tmp_path / "java-home", tmp_path / "java-started"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text(f"#!/bin/sh\necho \"$@\" >> {record}\nexit 1\n")
    java.chmod(0o755)
    env = dict(os.environ, JAVA_HOME=str(home), PATH=f"{home / 'bin'}:{os.environ['PATH']}")
    return env, record


def test_cheap_checks_and_a_run_with_nothing_new_start_no_jvm(data_dir: Path, tmp_path: Path) -> None:
    """Mistakes that need no Spark to find, and a run with nothing to ship,
    end in about a second without starting Spark's JVM."""
    with Log(data_dir, CFG) as log:
        fill(log, "ev", events(40), batch=1)
        for shard in range(4):  # the group has shipped everything
            log.group("ev", shard, "spark-ship").ack(log.shard_stats("ev", shard).next_entry - 1)
    env, record = fake_java(tmp_path)
    (tmp_path / "file").write_bytes(b"x")
    lake = tmp_path / "lake"
    cases = {
        (str(data_dir), "nosuch", str(lake)): f"Error: stream 'nosuch' does not exist in {data_dir}",
        (str(tmp_path / "nodir"), "ev", str(lake)): f"Error: {tmp_path / 'nodir'} is not a directory",
        (str(data_dir), "ev", str(tmp_path / "file" / "lake")):
            f"Error: lake {tmp_path / 'file' / 'lake'}: {tmp_path / 'file'} is not a directory",
        (str(data_dir), "ev", str(lake), "--group", "a/b"): "Error: group name 'a/b'",
    }
    for args, error in cases.items():
        started = time.monotonic()
        out = subprocess.run([str(COMET), "spark-ship", *args], env=env, capture_output=True,
                             text=True, timeout=60)
        took = time.monotonic() - started
        assert out.returncode == 1 and out.stderr.startswith(error), (args, out.stderr)
        assert len(out.stderr.splitlines()) == 1, out.stderr
        assert took < 3.0, (args, took)
    started = time.monotonic()
    out = subprocess.run([str(COMET), "spark-ship", str(data_dir), "ev", str(lake),
                          "--schema", "id long, device string"], env=env, capture_output=True,
                         text=True, timeout=60)
    took = time.monotonic() - started
    assert out.returncode == 0, out.stderr
    report = orjson.loads(out.stdout)
    assert (report["run"], report["rows"]) == (None, 0)
    assert report["seconds"] <= took < 3.0
    [done] = [orjson.loads(line) for line in out.stderr.splitlines()]
    assert (done["logger"], done["event"], done["run"]) == ("comet.spark_ship", "done", None)
    assert not record.exists(), record.read_text()
    assert not lake.exists()
    # With something new to ship, Spark starts: here its java fails, in one line.
    with Log(data_dir, CFG) as log:
        fill(log, "ev", events(1, start=40), batch=1)
    out = subprocess.run([str(COMET), "spark-ship", str(data_dir), "ev", str(lake)], env=env,
                         capture_output=True, text=True, timeout=120)
    *logged, error = out.stderr.splitlines()
    assert out.returncode == 1 and error.startswith(
        "Error: Spark's JVM did not start ([JAVA_GATEWAY_EXITED] "), out.stderr
    assert error.endswith("it needs Java 17 or later, as JAVA_HOME or java on PATH"), error
    assert all(orjson.loads(line)["level"] for line in logged)
    assert record.exists()


def test_otlp_schemas_as_spark_reads_them_and_a_run_in_its_executors(
        spark: SparkSession, data_dir: Path, tmp_path: Path) -> None:
    """The built-in OTLP schemas are Spark DDL that Spark's parser reads as
    spark_jobs/spark/otlp_schema.py does; an OTLP stream's tasks run in Spark's
    Python workers (the rows' checks: tests/test_lake_otlp.py)."""
    from pyspark.sql.types import MapType, TimestampType

    from spark_jobs.spark.otlp_schema import SIGNALS, ddl, value_type
    from spark_jobs.spark.schema import given_value_type

    from .support import otlp
    from .support.otlp_requests import metrics_request

    for signal in SIGNALS:
        assert given_value_type(ddl(signal)) == value_type(signal), signal
    points, _ = otlp.events("metrics", metrics_request().SerializeToString())
    with Log(data_dir, CFG) as log:
        log.create_stream("otel-metrics", 4)
        log.append_delimited("otel-metrics", b"".join(orjson.dumps(p) + b"\n" for p in points))
    lake = Lake(str(tmp_path / "lake"))
    report = ship(ShipOptions(str(data_dir), "otel-metrics", lake), lambda: spark)
    assert (report.rows, report.rejects) == (len(points), 0)
    df = read_dataframe(spark, lake, "otel-metrics")
    assert isinstance(df.schema["attributes"].dataType, MapType)
    assert isinstance(df.schema["time"].dataType, TimestampType)
    found = df.where("metric.name = 'requests'").selectExpr(
        "resource.attributes['service.name'] AS service", "as_int", "time_unix_nano").collect()
    assert [r.asDict() for r in found] == [{"service": "checkout", "as_int": 12345,
                                            "time_unix_nano": 1_763_700_000_123_456_789}]


def socket_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_cluster_master_goes_through_spark_submit(tmp_path: Path) -> None:
    """--master other than local[...] re-runs the job with spark-submit."""
    import spark_jobs.spark.submit

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "args.json"
    fake = bin_dir / "spark-submit"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\n"
                    f"open({str(record)!r}, 'w').write(json.dumps(sys.argv[1:]))\n")
    fake.chmod(0o755)
    (tmp_path / "data").mkdir()
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    out = subprocess.run([str(COMET), "spark-ship", str(tmp_path / "data"), "ev", "s3://b/lake",
                          "--master", "yarn", "--conf", "spark.executor.memory=2g", "--group", "g1"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    args = orjson.loads(record.read_bytes())
    assert args == ["--master", "yarn", "--conf", "spark.executor.memory=2g",
                    spark_jobs.spark.submit.__file__, str(tmp_path / "data"), "ev", "s3://b/lake",
                    "--conf", "spark.executor.memory=2g", "--group", "g1"]
