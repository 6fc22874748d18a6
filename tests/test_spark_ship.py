"""``comet spark-ship``: the log into a Parquet lake, exactly once."""

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

from storage_c import Config, Log
from spark_jobs.lake import manifested_files, read_table, unmanifested_files, read_dataframe
from spark_jobs.lakefs import Lake, LakeError
from spark_jobs.plan import manifests, plan_runs
from spark_jobs.ship import ShipOptions, ship

from .conftest import read_all

CFG = Config(shards=4, segment_bytes=1 << 20, compression_threshold=512)
COMET = Path(sys.executable).with_name("comet")
HOUR_MS = 3_600_000
T0_MS = 1_763_700_000_000  # 2025-11-21T04:40Z


def fill(log: Log, n: int, start: int = 0) -> None:
    """Events whose event time walks over several hours; some are large (compressed)."""
    for i in range(start, start + n):
        event = {"id": i, "device": f"dev-{i % 5}", "temp": 20.0 + i % 10,
                 "at": T0_MS + i * 37_000, "note": "n" * (i % 900)}
        log.append_batch("ev", [orjson.dumps(event)], key=f"k{i}")


def log_events(data_dir: Path) -> dict[tuple[int, int], dict]:  # type: ignore[type-arg]
    """(shard, entry) -> event, for every entry of the stream."""
    out = {}
    with Log(data_dir, CFG) as log:
        for shard in range(log.shard_count("ev")):
            for entry, _, payload in read_all(log, "ev", shard):
                out[(shard, entry)] = orjson.loads(payload) if payload.startswith(b"{") else payload
    return out


def lake_rows(lake: Lake) -> list[dict]:  # type: ignore[type-arg]
    return read_table(lake, "ev").to_pylist()


def check_lake(lake: Lake, data_dir: Path, group: str = "spark-ship") -> None:
    """The lake holds every JSON entry exactly once, in the right hour, and
    the group's offsets are at the end of the log."""
    events = log_events(data_dir)
    rows = lake_rows(lake)
    keys = [(r["_comet_shard"], r["_comet_entry"]) for r in rows]
    assert len(keys) == len(set(keys)), "duplicate rows in the lake"
    assert set(keys) == {k for k, v in events.items() if isinstance(v, dict)}
    for r in rows:
        event = events[(r["_comet_shard"], r["_comet_entry"])]
        assert (r["id"], r["device"], r["temp"]) == (event["id"], event["device"], event["temp"])
        hour = datetime.fromtimestamp(event["at"] / 1000, tz=timezone.utc)
        assert (r["stream"], r["dt"], r["hour"]) == ("ev", f"{hour:%Y-%m-%d}", hour.hour)
    assert unmanifested_files(lake, "ev") == []
    with Log(data_dir, CFG) as log:
        for shard in range(4):
            assert log.group("ev", shard, group, create=False).offset == \
                log.shard_stats("ev", shard).next_entry


def options(data_dir: Path, lake: Lake, **kw: object) -> ShipOptions:
    kw.setdefault("event_time_field", "at")
    return ShipOptions(str(data_dir), "ev", lake, **kw)  # type: ignore[arg-type]


def test_ship_to_a_local_lake(spark, data_dir: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    lake = Lake(str(tmp_path / "lake"))
    with Log(data_dir, CFG) as log:
        fill(log, 3000)
    first = ship(spark, options(data_dir, lake))  # schema inferred from a sample
    assert (first.run, first.rows, first.rejects, first.missing) == (1, 3000, 0, 0)
    check_lake(lake, data_dir)
    assert ship(spark, options(data_dir, lake)).run is None  # nothing new: no run
    with Log(data_dir, CFG) as log:
        fill(log, 500, start=3000)
    second = ship(spark, options(data_dir, lake))
    assert (second.run, second.rows) == (2, 500)
    check_lake(lake, data_dir)
    # The recipe for plain Spark: the manifested files, with the partition columns.
    df = read_dataframe(spark, lake, "ev")
    assert df.count() == 3500
    assert {"id", "device", "stream", "dt", "hour", "_comet_entry"} <= set(df.columns)
    assert all(f.startswith("stream=ev/dt=") for f in manifested_files(lake, "ev"))


def test_ship_to_s3(spark, data_dir: Path, moto_s3: str, aws_env: None) -> None:  # type: ignore[no-untyped-def]
    import boto3

    boto3.client("s3", endpoint_url=moto_s3).create_bucket(Bucket="edge")
    lake = Lake("s3://edge/lake", endpoint_url=moto_s3, access_key="test", secret_key="test")
    with Log(data_dir, CFG) as log:
        fill(log, 2000)
    report = ship(spark, options(data_dir, lake, value_schema="id long, device string, temp double, "
                                 "at long, note string", max_entries=1200))
    assert (report.run, report.rows) == (1, 1200)  # bounded run
    report = ship(spark, options(data_dir, lake))  # the rest, with the lake's schema
    assert (report.run, report.rows) == (2, 800)
    check_lake(lake, data_dir)
    keys = [o["Key"] for o in boto3.client("s3", endpoint_url=moto_s3)
            .list_objects_v2(Bucket="edge", Prefix="lake/")["Contents"]]
    assert not [k for k in keys if "/staging/" in k and not k.endswith("/")]  # cleaned up
    assert any(k.startswith("lake/stream=ev/dt=2025-11-21/hour=") for k in keys)


def test_rejects_keep_bad_entries_and_lose_nothing(spark, data_dir: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    lake = Lake(str(tmp_path / "lake"))
    with Log(data_dir, CFG) as log:
        fill(log, 400)
        bad = {log.append("ev", b"\xff not json", shard=1), log.append("ev", b'{"id": "x"}', shard=2),
               log.append("ev", b"[1, 2]", shard=3)}
        fill(log, 100, start=400)
    report = ship(spark, options(data_dir, lake, value_schema="id long, device string, temp double, "
                                 "at long"))
    assert (report.rows, report.rejects, report.missing) == (500, 3, 0)
    rejects = read_table(lake, "ev", kind="rejects").to_pylist()
    assert {(r["shard"], r["entry"]) for r in rejects} == bad
    assert {r["value"] for r in rejects} == {b"\xff not json", b'{"id": "x"}', b"[1, 2]"}
    assert all(r["error"] and r["stream"] == "ev" for r in rejects)
    assert len(lake_rows(lake)) == 500
    with Log(data_dir, CFG) as log:  # acked past the rejects too: they are stored, not lost
        assert all(log.group("ev", s, "spark-ship").lag == 0 for s in range(4))


def test_clear_errors_and_nothing_acked(spark, data_dir: Path, tmp_path: Path, aws_env: None) -> None:  # type: ignore[no-untyped-def]
    with Log(data_dir, CFG) as log:
        fill(log, 50)
    lake = Lake(str(tmp_path / "lake"))
    with pytest.raises(ValueError, match="stream 'nope' does not exist"):
        ship(spark, ShipOptions(str(data_dir), "nope", lake))
    with pytest.raises(ValueError, match="not valid Spark DDL"):
        ship(spark, options(data_dir, lake, value_schema="id lon g,,"))
    with pytest.raises(ValueError, match="event time field 'when' is not in the value schema"):
        ship(spark, options(data_dir, lake, value_schema="id long", event_time_field="when"))
    with pytest.raises(ValueError, match="_comet_"):
        ship(spark, options(data_dir, lake, value_schema="_comet_entry long"))
    with pytest.raises(LakeError, match="use a local path or s3://"):
        Lake("ftp://x/y")
    closed = socket_port()
    unreachable = Lake("s3://edge/lake", endpoint_url=f"http://127.0.0.1:{closed}")
    started = time.monotonic()
    with pytest.raises(LakeError, match="not reachable"):
        ship(spark, options(data_dir, unreachable))
    assert time.monotonic() - started < 60
    assert plan_runs(lake, "ev") == []
    with Log(data_dir, CFG) as log:
        assert log.groups("ev") == []  # nothing registered, nothing acked


def socket_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # type: ignore[no-any-return]


# ---- crashes: the real command, killed -------------------------------------------------

def run_job(data_dir: Path, lake_dir: Path, *, crash: str | None = None,
            kill_after: float | None = None, timeout: float = 240) -> int:
    """``comet spark-ship`` in its own session; killed with SIGKILL at a
    fault point or after ``kill_after`` seconds.  Returns the exit status."""
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1",
               COMET_SPARK_LOG_LEVEL="ERROR")
    env.pop("COMET_SPARK_SHIP_CRASH", None)
    if crash:
        env["COMET_SPARK_SHIP_CRASH"] = crash
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
    if proc.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(f"spark-ship failed ({proc.returncode}):\n{err.decode()[-3000:]}")
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


def test_exactly_once_under_sigkill(data_dir: Path, tmp_path: Path) -> None:
    lake_dir = tmp_path / "lake"
    lake = Lake(str(lake_dir))
    rng = random.Random(20261121)
    with Log(data_dir, CFG) as log:
        fill(log, 3000)
    started = time.monotonic()
    assert run_job(data_dir, lake_dir) == 0
    full_run_s = time.monotonic() - started
    check_lake(lake, data_dir)
    # Five kills at each step of the protocol, five at random moments.
    kills = ["planned", "written", "publishing", "manifested", "acking"] + [None] * 5
    produced = 3000
    for crash in kills:
        with Log(data_dir, CFG) as log:
            fill(log, 700, start=produced)
        produced += 700
        if crash:
            assert run_job(data_dir, lake_dir, crash=crash) == -signal.SIGKILL
        else:
            run_job(data_dir, lake_dir, kill_after=rng.uniform(1.0, full_run_s))
        # Whatever a reader sees meanwhile comes from manifests: never a duplicate.
        keys = [(r["_comet_shard"], r["_comet_entry"]) for r in lake_rows(lake)]
        assert len(keys) == len(set(keys))
    assert run_job(data_dir, lake_dir) == 0  # finishes the interrupted run, ships the rest
    check_lake(lake, data_dir)
    runs = [m.run for m in manifests(lake, "ev")]
    assert runs == sorted(set(runs))
    assert sum(m.rows for m in manifests(lake, "ev")) == produced


def test_a_cluster_master_goes_through_spark_submit(tmp_path: Path) -> None:
    """--master other than local[...] re-runs the job with spark-submit."""
    import spark_jobs.submit

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
                    spark_jobs.submit.__file__, str(tmp_path / "data"), "ev", "s3://b/lake",
                    "--conf", "spark.executor.memory=2g", "--group", "g1"]
