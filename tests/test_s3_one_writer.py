"""One writer in an S3 lake, against moto's S3 server: the run's lock
(spark_jobs/lake/lock/s3lease.py): of two runs at once one ships and the other is told
who does; a lease is renewed while its run works, and taken over once a
killed run's has run out.  A store without conditional writes is refused
unless the lake has one writer; then the Delta commits go through a local
copy of the log (spark_jobs/lake/logmirror.py).  No JVM: ``comet spark-ship``'s
runs here are ``ship()`` with its tasks in this process."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import threading
import time
import uuid
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, Callable, Iterator

import orjson
import pytest

from spark_jobs.lake import delta
from spark_jobs.lake.lock import s3lease
from spark_jobs.lake.lakefs import Lake
from spark_jobs.lake.lock.holder import LakeBusy, lock_rel
from spark_jobs.lake.logmirror import LogMoved, local_log
from spark_jobs.lake.lock.s3lease import NoConditionalWrites, s3_lease
from spark_jobs.spark.ship import ShipOptions, ship
from storage_c import Config, Log

from .support.lake import check_exactly_once, in_process
from .support.processes import worker
from .support.storage import fill

CFG = Config(shards=2, segment_bytes=1 << 20)
KEY = f"lake/{lock_rel('ev', 'g')}"
ME = f"pid {os.getpid()} on {socket.gethostname()}"


@pytest.fixture
def s3(moto_s3: str, aws_env: None) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=moto_s3)


@pytest.fixture
def lake(moto_s3: str, s3: Any) -> Lake:
    """An S3 lake in a bucket of its own (moto's objects live as long as the test process)."""
    bucket = f"lake-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    return Lake(f"s3://{bucket}/lake", endpoint_url=moto_s3, access_key="test", secret_key="test")


def bucket(lake: Lake) -> str:
    return lake.root.split("/", 1)[0]


def objects(s3: Any, lake: Lake) -> dict[str, str]:
    """Every object of the lake's bucket: key -> ETag."""
    listed = s3.list_objects_v2(Bucket=bucket(lake)).get("Contents", [])
    return {o["Key"]: o["ETag"] for o in listed}


def lock_doc(s3: Any, lake: Lake) -> dict[str, Any]:
    return dict(json.loads(s3.get_object(Bucket=bucket(lake), Key=KEY)["Body"].read()))


def store_age(s3: Any, lake: Lake) -> float:
    """Seconds since the lock was last written, by the store's clock."""
    head = s3.head_object(Bucket=bucket(lake), Key=KEY)
    now = parsedate_to_datetime(head["ResponseMetadata"]["HTTPHeaders"]["date"])
    return float((now - head["LastModified"]).total_seconds())


def wait_for(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def try_lock(lake: Lake) -> str:
    """Takes and releases the lake's lock: "took", or why not."""
    try:
        with s3_lease(lake, "ev", "g"):
            return "took"
    except LakeBusy as exc:
        return str(exc)


def two_at_once(s3: Any, lake: Lake) -> tuple[list[str], dict[str, Any]]:
    """Two runs take the lake's lock at the same moment: what each got
    ("took" first), and the lock object while the one that took it holds it."""
    start, release = threading.Barrier(2), threading.Event()
    outcomes: queue.Queue[str] = queue.Queue()

    def run() -> None:
        start.wait()
        try:
            with s3_lease(lake, "ev", "g"):
                outcomes.put("took")
                release.wait(30)
        except LakeBusy as exc:
            outcomes.put(str(exc))

    runs = [threading.Thread(target=run) for _ in range(2)]
    for t in runs:
        t.start()
    try:
        got = sorted([outcomes.get(timeout=30), outcomes.get(timeout=30)], key=len)
        return got, lock_doc(s3, lake)
    finally:
        release.set()
        for t in runs:
            t.join()


def test_of_two_runs_at_once_one_takes_the_lock_and_the_other_is_told_who(lake: Lake, s3: Any) -> None:
    for _ in range(5):
        got, held = two_at_once(s3, lake)
        assert got[0] == "took" and held["pid"] == os.getpid()
        assert f"another comet spark-ship ({ME}, since " in got[1]
        assert f"is shipping stream 'ev' with group 'g' into {lake.url}: one run at a time; " \
            "this one changed nothing" in got[1]
        assert objects(s3, lake) == {}  # released; the probes removed


def test_a_lease_is_renewed_while_its_run_works(lake: Lake, s3: Any,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(s3lease, "LEASE_S", 1.0)
    with s3_lease(lake, "ev", "g"):
        first = s3.head_object(Bucket=bucket(lake), Key=KEY)["LastModified"]
        # renewed past the moment the lease would have run out without renewal
        wait_for(lambda: (s3.head_object(Bucket=bucket(lake), Key=KEY)["LastModified"]
                          - first).total_seconds() >= 3)
        assert ME in try_lock(lake)
        assert lock_doc(s3, lake)["lease_s"] == 1.0
    assert objects(s3, lake) == {}


def test_an_expired_lease_is_taken_over_by_one_of_two(lake: Lake, s3: Any,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # what a run killed long ago leaves: nobody renews it
    dead = {"pid": 999_999, "host": "elsewhere", "since": "2026-01-01T00:00:00Z", "stream": "ev",
            "group": "g", "lease_s": 2.0}
    s3.put_object(Bucket=bucket(lake), Key=KEY, Body=json.dumps(dead).encode())
    assert "(pid 999999 on elsewhere, since 2026-01-01T00:00:00Z)" in try_lock(lake)
    monkeypatch.setattr(s3lease, "LEASE_S", 30.0)
    wait_for(lambda: store_age(s3, lake) > 2.0 + 1)  # run out, by the store's clock
    got, taken = two_at_once(s3, lake)
    assert got[0] == "took" and ME in got[1]
    assert (taken["pid"], taken["lease_s"]) == (os.getpid(), 30.0)
    assert objects(s3, lake) == {}


def test_a_run_that_lost_its_lease_leaves_the_new_holders_lock(
        lake: Lake, s3: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(s3lease, "LEASE_S", 0.6)
    other = {"pid": 4242, "host": "elsewhere", "since": "2026-11-27T00:00:00Z", "stream": "ev",
             "group": "g", "lease_s": 120.0}
    with s3_lease(lake, "ev", "g"):
        # another run took it over (as after a stall longer than the lease)
        etag = s3.put_object(Bucket=bucket(lake), Key=KEY, Body=json.dumps(other).encode())["ETag"]
        # the next renewal is refused, and says so
        wait_for(lambda: any(r.msg == "lost_lock" for r in caplog.records))
    assert lock_doc(s3, lake) == other
    assert s3.head_object(Bucket=bucket(lake), Key=KEY)["ETag"] == etag


@pytest.mark.slow
def test_a_killed_runs_lock_holds_until_its_lease_runs_out(lake: Lake, s3: Any) -> None:
    lease_s = 3.0
    holder = worker("hold_s3_lease", lake.endpoint_url, lake.url, "ev", "g", lease_s,
                    stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == b"held\n"
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        killed = time.monotonic()
        assert f"(pid {holder.pid} on {socket.gethostname()}" in try_lock(lake)
        wait_for(lambda: try_lock(lake) == "took")
        # not before the lease ran out: the last renewal was at most a third of it before the kill
        assert time.monotonic() - killed >= lease_s * 2 / 3
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert objects(s3, lake) == {}


def ignoring_conditions(monkeypatch: pytest.MonkeyPatch) -> None:
    """moto as a store that ignores If-None-Match and If-Match on PUT."""
    from moto.s3.responses import S3Response
    from werkzeug.datastructures import Headers

    put = S3Response.put_object

    def put_ignoring(self: S3Response) -> Any:
        self.headers = Headers(self.headers)
        for name in ("If-None-Match", "If-Match"):
            self.headers.remove(name)
        return put(self)

    monkeypatch.setattr(S3Response, "put_object", put_ignoring)


def refusing_conditions(monkeypatch: pytest.MonkeyPatch) -> None:
    """moto as OpenStack Swift 2.30's s3api: a PUT with If-None-Match or If-Match is refused."""
    from moto.s3.responses import S3Response

    put = S3Response.put_object

    def put_refusing(self: S3Response) -> Any:
        if "If-None-Match" in self.headers or "If-Match" in self.headers:
            return 501, {}, ("<?xml version='1.0' encoding='UTF-8'?>\n<Error><Code>NotImplemented"
                             "</Code><Message>Conditional object PUTs are not supported.</Message>"
                             "</Error>")
        return put(self)

    monkeypatch.setattr(S3Response, "put_object", put_refusing)


def single_writer(lake: Lake) -> Lake:
    return Lake(lake.url, endpoint_url=lake.endpoint_url, access_key="test", secret_key="test",
                single_writer=True)


def test_a_store_that_ignores_conditional_writes_is_refused_unless_single_writer(
        lake: Lake, s3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    ignoring_conditions(monkeypatch)
    held = {"pid": 4242, "host": "elsewhere", "since": "2026-11-27T00:00:00Z", "stream": "ev",
            "group": "g", "lease_s": 120.0}
    s3.put_object(Bucket=bucket(lake), Key=KEY, Body=json.dumps(held).encode())
    before = objects(s3, lake)
    with pytest.raises(NoConditionalWrites, match=(
            f"lake {lake.url}: the object store does not support conditional writes "
            r"\(If-None-Match\), so neither the run's lock nor the Delta commits can keep a "
            "second writer out; if only one process ever ships into this lake, say so with "
            "--single-writer")):
        with s3_lease(lake, "ev", "g"):
            pytest.fail("took the lock")
    assert objects(s3, lake) == before  # the other run's lock untouched, the probe gone
    one = single_writer(lake)
    s3.delete_object(Bucket=bucket(lake), Key=KEY)
    with s3_lease(one, "ev", "g"):
        assert lock_doc(s3, lake)["pid"] == os.getpid()
    assert objects(s3, lake) == {}


# ---- through comet spark-ship's run --------------------------------------------------------

def readings(start: int, n: int) -> list[bytes]:
    return [orjson.dumps({"id": i, "site": f"s{i % 3}", "v": i / 2}) for i in range(start, start + n)]


def group_offsets(data_dir: Path) -> dict[int, int | None]:
    from storage_c import GroupNotFound

    out: dict[int, int | None] = {}
    with Log(data_dir, CFG) as log:
        for shard in range(log.shard_count("ev")):
            try:
                out[shard] = log.group("ev", shard, "g", create=False).offset
            except GroupNotFound:
                out[shard] = None
    return out


def no_spark() -> Any:
    """The Spark of a run that must be refused before it starts one."""
    raise AssertionError("the run started Spark")


@contextlib.contextmanager
def held_elsewhere(lake: Lake) -> Iterator[subprocess.Popen[bytes]]:
    """Another process shipping stream ev with group g into the lake: it holds the lock."""
    holder = worker("hold_s3_lease", lake.endpoint_url, lake.url, "ev", "g", 120,
                    stdout=subprocess.PIPE)
    assert holder.stdout is not None
    try:
        assert holder.stdout.readline() == b"held\n"
        yield holder
    finally:
        holder.kill()
        holder.wait()


def test_a_second_ship_while_the_lease_is_held_is_refused_and_changes_nothing(
        lake: Lake, s3: Any, data_dir: Path) -> None:
    opts = ShipOptions(str(data_dir), "ev", lake, group="g")
    with Log(data_dir, CFG) as log:
        fill(log, "ev", readings(0, 300), shards=2, batch=10)
    with held_elsewhere(lake) as holder:  # before the lake's first run
        with pytest.raises(LakeBusy, match=f"another comet spark-ship \\(pid {holder.pid} on "):
            ship(opts, no_spark)
        assert [k for k in objects(s3, lake) if not k.endswith(".lock")] == []
        assert group_offsets(data_dir) == {0: None, 1: None}  # not even registered
    s3.delete_object(Bucket=bucket(lake), Key=KEY)  # as once its lease has run out
    assert ship(opts, in_process).run == 1
    with Log(data_dir, CFG) as log:
        fill(log, "ev", readings(300, 200), batch=10)
    with held_elsewhere(lake) as holder:  # and with a run committed
        lake_before, offsets_before = objects(s3, lake), group_offsets(data_dir)
        with pytest.raises(LakeBusy, match=f"another comet spark-ship \\(pid {holder.pid} on "):
            ship(opts, no_spark)
        assert objects(s3, lake) == lake_before
        assert group_offsets(data_dir) == offsets_before
    s3.delete_object(Bucket=bucket(lake), Key=KEY)
    report = ship(opts, in_process)
    assert (report.run, report.rows) == (2, 200)
    check_exactly_once(lake, data_dir, "ev", CFG, group="g")


def test_a_store_that_refuses_conditional_writes_takes_a_single_writers_runs(
        lake: Lake, s3: Any, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    refusing_conditions(monkeypatch)
    monkeypatch.setattr(delta, "CHECKPOINT_EVERY", 2)  # runs commit from a checkpoint too
    with Log(data_dir, CFG) as log:
        fill(log, "ev", readings(0, 300), shards=2, batch=10)
    with pytest.raises(NoConditionalWrites, match="say so with --single-writer"):
        ship(ShipOptions(str(data_dir), "ev", lake, group="g"), no_spark)
    assert objects(s3, lake) == {}
    assert group_offsets(data_dir) == {0: None, 1: None}
    opts = ShipOptions(str(data_dir), "ev", single_writer(lake), group="g")
    assert (ship(opts, in_process).run, lake_version(lake)) == (1, 0)
    with Log(data_dir, CFG) as log:
        fill(log, "ev", readings(300, 100) + [b"not json"], batch=10)  # a reject: both tables
    assert ship(opts, in_process).rejects == 1
    with Log(data_dir, CFG) as log:
        fill(log, "ev", [orjson.dumps({"id": i, "new": "field"}) for i in range(400, 450)])
    report = ship(opts, in_process)
    assert (report.new_columns, lake_version(lake)) == (["new"], 3)  # a column added, a run
    with Log(data_dir, CFG) as log:
        fill(log, "ev", readings(450, 50))
    assert (ship(opts, in_process).run, lake_version(lake)) == (4, 4)  # a checkpoint
    log_names = {k.rsplit("/", 1)[1] for k in objects(s3, lake) if "lake/_delta_log/" in k}
    assert log_names == {f"{v:020d}.json" for v in range(5)} | {  # the column's commit too
        "00000000000000000002.checkpoint.parquet", "00000000000000000004.checkpoint.parquet",
        "_last_checkpoint"}
    for v in range(4):  # as Delta's log cleanup would: the log starts at the checkpoint
        s3.delete_object(Bucket=bucket(lake), Key=f"lake/_delta_log/{v:020d}.json")
    with Log(data_dir, CFG) as log:
        fill(log, "ev", readings(500, 50))
    assert (ship(opts, in_process).run, lake_version(lake)) == (5, 5)
    rows, rejects = check_exactly_once(lake, data_dir, "ev", CFG, group="g")
    assert sorted(r["id"] for r in rows.select(["id"]).to_pylist()) == list(range(550))
    assert rejects.column("value").to_pylist() == [b"not json"]
    log_names = {k.rsplit("/", 1)[1] for k in objects(s3, lake) if "lake/_delta_log/" in k}
    assert log_names == {"00000000000000000004.json", "00000000000000000005.json",
                         "00000000000000000002.checkpoint.parquet",  # (left: not cleaned here)
                         "00000000000000000004.checkpoint.parquet", "_last_checkpoint"}
    assert not [k for k in objects(s3, lake) if "/_comet/locks/" in k]


def lake_version(lake: Lake) -> int:
    from deltalake import DeltaTable

    return int(DeltaTable(lake.url, storage_options=delta.storage_options(lake)).version())


def test_a_commit_another_writer_made_meanwhile_is_never_overwritten(lake: Lake, s3: Any) -> None:
    key = "lake/_delta_log/00000000000000000000.json"
    with pytest.raises(LogMoved, match=f"{lake.url}/_delta_log/00000000000000000000.json was "
                       "written by another writer"):
        with local_log(single_writer(lake), "") as root:
            s3.put_object(Bucket=bucket(lake), Key=key, Body=b'{"theirs": 1}\n')
            Path(root, "_delta_log", "00000000000000000000.json").write_bytes(b'{"ours": 1}\n')
    assert s3.get_object(Bucket=bucket(lake), Key=key)["Body"].read() == b'{"theirs": 1}\n'
    assert list(objects(s3, lake)) == [key]
