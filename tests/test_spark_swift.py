"""``comet spark-ship`` against a real object store: OpenStack Swift's s3api.

moto (test_s3_lock.py, test_spark_ship.py) implements S3 from the
specification; Swift is an independent implementation with its own quirks,
which is what an edge box may ship to: no flexible checksums, no
DeleteObjects without Content-MD5, and no conditional writes (a PUT with
``If-None-Match`` or ``If-Match`` is refused: 501 NotImplemented).  So
neither the run's lock nor delta-rs's commits can keep a second writer out
there: ``comet spark-ship`` refuses such a lake unless told that it has
one writer (``--single-writer``).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest

from storage_c import Config, Log
from spark_jobs.lake.delta import storage_options
from spark_jobs.lake.read import read_table
from spark_jobs.lake.lakefs import Lake
from spark_jobs.lake.lock.holder import LakeBusy
from spark_jobs.lake.lock.s3lease import s3_lease
from spark_jobs.spark.ship import ShipOptions, ship

from .support.lake import check_exactly_once, in_process
from .support.server import COMET
from .support.storage import fill
from .support.swift_server import SwiftS3Server

CFG = Config(shards=3, segment_bytes=1 << 20)


def readings(start: int, n: int) -> list[bytes]:
    return [orjson.dumps({"id": i, "site": f"s{i % 4}", "v": i * 0.5}) for i in range(start, start + n)]


def client(swift: SwiftS3Server) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=swift.endpoint_url, aws_access_key_id=swift.access_key,
                        aws_secret_access_key=swift.secret_key, region_name=swift.region)


def swift_lake(swift: SwiftS3Server, url: str, single_writer: bool = False) -> Lake:
    return Lake(url, endpoint_url=swift.endpoint_url, region=swift.region,
                access_key=swift.access_key, secret_key=swift.secret_key,
                single_writer=single_writer)


def keys(swift: SwiftS3Server, bucket: str) -> dict[str, str]:
    listed = client(swift).list_objects_v2(Bucket=bucket).get("Contents", [])
    return {o["Key"]: o["ETag"] for o in listed}


def spark_ship(swift: SwiftS3Server, data_dir: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, **swift.env(), "COMET_SPARK_LOG_LEVEL": "ERROR"}
    return subprocess.run([str(COMET), "spark-ship", str(data_dir), "ev", "s3://lake/edge-1",
                           "--master", "local[2]", "--schema", "id long, site string, v double", *args],
                          env=env, capture_output=True, timeout=300)


def shipped(out: subprocess.CompletedProcess[bytes]) -> dict[str, Any]:
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    done: dict[str, Any] = orjson.loads(out.stdout.splitlines()[-1])
    return done


def test_swift_refuses_conditional_writes_and_so_delta_rs_commits(s3env: SwiftS3Server) -> None:
    from botocore.exceptions import ClientError
    from deltalake import write_deltalake

    swift = s3env
    s3 = client(swift)
    s3.create_bucket(Bucket="facts")
    etag = s3.put_object(Bucket="facts", Key="k", Body=b"1")["ETag"]
    for key, condition in (("k", {"IfNoneMatch": "*"}), ("new", {"IfNoneMatch": "*"}),
                           ("k", {"IfMatch": etag})):
        with pytest.raises(ClientError) as refused:
            s3.put_object(Bucket="facts", Key=key, Body=b"2", **condition)
        assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 501
        assert refused.value.response["Error"] == {
            "Code": "NotImplemented", "Message": "Conditional object PUTs are not supported."}
    # delta-rs 1.6 creates each commit file with If-None-Match: *, and none of
    # its S3 options makes it do otherwise (so a single-writer lake's commits
    # go through a local copy of the log: spark_jobs/lake/logmirror.py)
    rows = pa.table({"x": [1, 2]})
    base = storage_options(swift_lake(swift, "s3://facts/t"))
    assert base is not None
    for name, extra in {"default": {}, "unsafe-rename": {"AWS_S3_ALLOW_UNSAFE_RENAME": "true"},
                        "no-conditional-put": {"conditional_put": "disabled",
                                               "AWS_S3_ALLOW_UNSAFE_RENAME": "true"},
                        "copy-if-not-exists": {"copy_if_not_exists": "multipart",
                                               "AWS_S3_ALLOW_UNSAFE_RENAME": "true"}}.items():
        with pytest.raises(OSError, match="Conditional object PUTs are not supported|conditional "
                           "put is disabled not yet implemented"):
            write_deltalake(f"s3://facts/{name}", rows,
                            storage_options={**base, **extra, "max_retries": "0"})
    assert not [k for k in keys(swift, "facts") if "/_delta_log/" in k]


def test_ship_to_swift_needs_single_writer(s3env: SwiftS3Server, data_dir: Path) -> None:
    swift = s3env
    client(swift).create_bucket(Bucket="lake")
    with Log(data_dir, CFG) as log:
        for start in range(0, 3000, 100):
            fill(log, "ev", readings(start, 100), key=str(start))
    out = spark_ship(swift, data_dir)
    assert out.returncode == 1
    assert out.stderr.decode().splitlines()[-1] == (
        "Error: lake s3://lake/edge-1: the object store does not support conditional writes "
        "(If-None-Match), so neither the run's lock nor the Delta commits can keep a second "
        "writer out; if only one process ever ships into this lake, say so with --single-writer")
    assert keys(swift, "lake") == {}
    with Log(data_dir, CFG) as log:
        assert [g for g in log.groups("ev") if g.name == "spark-ship"] == []
    assert shipped(spark_ship(swift, data_dir, "--single-writer"))["rows"] == 3000
    with Log(data_dir, CFG) as log:
        fill(log, "ev", readings(3000, 500), key="3000")
    assert shipped(spark_ship(swift, data_dir, "--single-writer"))["rows"] == 500
    lake = swift_lake(swift, "s3://lake/edge-1")  # reading needs no promise
    rows = read_table(lake, "ev").to_pylist()
    assert sorted(r["id"] for r in rows) == list(range(3500))
    assert {(r["id"] % 4, r["site"]) for r in rows} == {(k, f"s{k}") for k in range(4)}
    check_exactly_once(lake, data_dir, "ev", CFG)
    log_keys = [k for k in keys(swift, "lake") if "/_delta_log/" in k]
    main = sorted(k.rsplit("/", 1)[1] for k in log_keys if "/_rejects/" not in k)
    assert main == ["00000000000000000000.json", "00000000000000000001.json"]  # no temporary commit left
    rejects = sorted(k.rsplit("/", 1)[1] for k in log_keys if "/_rejects/" in k)
    assert rejects == ["00000000000000000000.json"]  # made, empty, by the first run
    assert not [k for k in keys(swift, "lake") if "/_comet/locks/" in k]


def test_one_run_at_a_time_on_swift_too(s3env: SwiftS3Server, data_dir: Path) -> None:
    """With --single-writer the lock is written with plain PUTs: it still
    turns away a run started while another holds it."""
    swift = s3env
    client(swift).create_bucket(Bucket="busy")
    lake = swift_lake(swift, "s3://busy/lake", single_writer=True)
    with Log(data_dir, CFG) as log:
        fill(log, "ev", readings(0, 200), shards=3)
    opts = ShipOptions(str(data_dir), "ev", lake)
    with s3_lease(lake, "ev", "spark-ship"):
        before = keys(swift, "busy")
        with pytest.raises(LakeBusy, match=rf"another comet spark-ship \(pid {os.getpid()} on "):
            ship(opts, in_process)
        assert keys(swift, "busy") == before
    assert ship(opts, in_process).rows == 200
    check_exactly_once(lake, data_dir, "ev", CFG)
