"""``comet spark-ship`` against a real object store: OpenStack Swift's s3api.

moto (test_spark_ship.py) implements S3 from the specification; Swift is an
independent implementation with its own quirks (no flexible checksums, no
Content-MD5-less DeleteObjects), which is what an edge box may ship to.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import orjson

from storage_c import Config, Log
from spark_jobs.lake import read_table, unmanifested_files
from spark_jobs.lakefs import Lake

from .support.server import COMET
from .support.storage import fill
from .support.swift_server import SwiftS3Server

CFG = Config(shards=3, segment_bytes=1 << 20)


def readings(start: int, n: int) -> list[bytes]:
    return [orjson.dumps({"id": i, "site": f"s{i % 4}", "v": i * 0.5}) for i in range(start, start + n)]


def ship(swift: SwiftS3Server, data_dir: Path) -> dict[str, Any]:
    env = {**os.environ, **swift.env(), "COMET_SPARK_LOG_LEVEL": "ERROR"}
    out = subprocess.run([str(COMET), "spark-ship", str(data_dir), "ev", "s3://lake/edge-1",
                          "--master", "local[2]", "--schema", "id long, site string, v double"],
                         env=env, capture_output=True, timeout=300)
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    done: dict[str, Any] = orjson.loads(out.stdout.splitlines()[-1])
    return done


def test_ship_to_swift(s3env: SwiftS3Server, data_dir: Path) -> None:
    import boto3

    swift = s3env

    client = boto3.client("s3", endpoint_url=swift.endpoint_url, aws_access_key_id=swift.access_key,
                          aws_secret_access_key=swift.secret_key, region_name=swift.region)
    client.create_bucket(Bucket="lake")
    lake = Lake("s3://lake/edge-1", endpoint_url=swift.endpoint_url, region=swift.region,
                access_key=swift.access_key, secret_key=swift.secret_key)
    with Log(data_dir, CFG) as log:
        for start in range(0, 3000, 100):
            fill(log, "ev", readings(start, 100), key=str(start))
    assert ship(swift, data_dir)["rows"] == 3000
    with Log(data_dir, CFG) as log:
        fill(log, "ev", readings(3000, 500), key="3000")
    assert ship(swift, data_dir)["rows"] == 500
    rows = read_table(lake, "ev").to_pylist()
    assert sorted(r["id"] for r in rows) == list(range(3500))
    assert {(r["id"] % 4, r["site"]) for r in rows} == {(k, f"s{k}") for k in range(4)}
    assert unmanifested_files(lake, "ev") == []
    keys = [o["Key"] for o in client.list_objects_v2(Bucket="lake")["Contents"]]
    assert not [k for k in keys if "/staging/" in k and not k.endswith("/")]
    with Log(data_dir, CFG) as log:
        assert all(g.lag == 0 for g in log.groups("ev") if g.name == "spark-ship")
