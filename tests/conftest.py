"""Fixtures only (shared helpers are in tests/support/): scratch data directories, a
small log, local S3 servers, one SparkSession; and the markers of the test tiers."""

from __future__ import annotations

import os
import sys
import threading
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Generator, Iterator

import pytest

from storage_c import Log

from .support.storage import SMALL

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# The test tiers.  `make check` (the quick tier) runs what has none of these marks;
# `make test` runs everything.  A test gets a mark from what it uses, so a new test
# lands in the right tier by itself: a fixture (the SparkSession, Swift, the Docker
# daemon, the power-cut filesystem), a module named for Spark (its tests start
# `comet spark-ship`, a JVM, without the fixture too), the tests/powercut directory.
# Long crash, multi-process and load tests carry @pytest.mark.slow themselves.
MARK_BY_FIXTURE = {"spark": "spark", "swift": "swift", "s3env": "swift", "docker": "docker",
                   "powercut": "fuse"}
# `make test` runs pytest on several workers (pytest-xdist, --dist loadgroup): the tests of
# one group all run on one worker, one after another.  Spark: one SparkSession (a JVM of
# 2 GiB) for all of them, and no two JVMs fighting for the two cores.  Docker: the daemon
# and the images built once (tests/test_docker.py's module fixtures).
XDIST_GROUPS = ("docker", "spark")


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config,
                                  items: list[pytest.Item]) -> Generator[None, None, None]:
    for item in items:
        path = item.path.relative_to(Path(__file__).parent)
        marks = {MARK_BY_FIXTURE[f] for f in getattr(item, "fixturenames", ()) if f in MARK_BY_FIXTURE}
        if "spark" in path.name:
            marks.add("spark")
        if path.parts[0] == "powercut":
            marks.add("fuse")
        for mark in sorted(marks):
            item.add_marker(mark)
        group = next((g for g in XDIST_GROUPS if g in marks), None)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    yield
    # pytest-xdist tells the groups to its scheduler in the node ids ("...@spark"), which some
    # pytest releases ignore (pytest-xdist#1386): then the grouped tests would go to any
    # worker, silently; they fail instead (pytest_runtest_setup below).
    if getattr(config.option, "loadgroup", False):
        for item in items:
            if item.get_closest_marker("xdist_group") and "@" not in item.nodeid:
                item.stash[UNGROUPED] = True


UNGROUPED = pytest.StashKey[bool]()


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.stash.get(UNGROUPED, False):
        pytest.fail("pytest-xdist's --dist loadgroup does not group this test with this pytest "
                    "(see the pytest pin in pyproject.toml)", pytrace=False)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def log(data_dir: Path) -> Iterator[Log]:
    with Log(data_dir, SMALL) as opened:
        yield opened


@pytest.fixture
def moto_s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A local S3 (moto's server) on 127.0.0.1; the endpoint URL.

    moto checks a PUT's If-None-Match / If-Match and then stores the object,
    in two steps; two PUTs at once could both pass the check.  S3 does both
    atomically, and so does moto here: its PUTs take turns."""
    from moto.s3.responses import S3Response
    from moto.server import ThreadedMotoServer

    put, turns = S3Response.put_object, threading.Lock()

    def put_in_turn(self: S3Response) -> object:
        with turns:
            return put(self)

    monkeypatch.setattr(S3Response, "put_object", put_in_turn)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    # moto keeps its buckets in this process, not in the server: each test starts empty
    urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset", method="POST"),
                           timeout=10).close()
    yield url
    server.stop()


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dummy credentials, so no test ever talks to real AWS with real ones."""
    for var, value in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(var, value)
    for var in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    _fresh_boto3_session(monkeypatch)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One SparkSession for the whole run (starting one costs seconds): on the one worker of
    the spark group under pytest-xdist (XDIST_GROUPS)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from spark_jobs.spark.session import spark_session

    session: SparkSession = spark_session("local[2]", app="comet-tests",
                            conf=[("spark.sql.shuffle.partitions", "4"),
                                  ("spark.driver.memory", "2g")])
    yield session
    session.stop()


@pytest.fixture(scope="session")
def swift() -> Iterator[object]:
    """OpenStack Swift with s3api on 127.0.0.1 (tests/support/swift_server.py), one per run."""
    from .support.swift_server import SwiftS3Server, SwiftUnavailable

    try:
        server = SwiftS3Server().start()
    except SwiftUnavailable as exc:
        pytest.skip(f"OpenStack Swift cannot be installed here: {exc.reason}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3env(swift: object, monkeypatch: pytest.MonkeyPatch) -> object:
    """The AWS_* environment of the Swift server (checksum settings included) for this test."""
    for name, value in swift.env().items():  # type: ignore[attr-defined]  # a SwiftS3Server
        monkeypatch.setenv(name, value)
    for stray in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(stray, raising=False)
    _fresh_boto3_session(monkeypatch)
    return swift


def _fresh_boto3_session(monkeypatch: pytest.MonkeyPatch) -> None:
    """boto3's default session keeps the credentials it first found: start
    this test with one that reads the environment just set."""
    import boto3

    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
