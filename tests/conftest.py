"""Fixtures only (shared helpers are in tests/support/): scratch data directories, a
small log, local S3 servers, one SparkSession; and the markers of the test tiers."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

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
# SLOW names the long tests (5-55 s each on 2 shared cores): crash loops, kills and
# reloads under load, processes racing, the fuzzers, retries against a local S3, the
# locust run.
MARK_BY_FIXTURE = {"spark": "spark", "swift": "swift", "s3env": "swift", "docker": "docker",
                   "powercut": "fuse"}
SLOW = {
    "test_crash.py::test_crash_loop_kill_9",
    "test_gateway_e2e.py::test_hup_reload_and_term_under_load",
    "test_gateway_e2e.py::test_kill_9_of_a_worker_under_load",
    "test_gateway_fuzz.py::test_api_conforms_to_its_openapi",
    "test_http_protocol.py::test_connections_meeting_a_graceful_stop_get_a_status",
    "test_json_fuzz.py::test_seeded_differential",
    "test_loadtest.py::test_short_locust_run_loses_nothing",
    "test_reload.py::test_reloads_and_stop_under_load_answer_every_request",
    "test_ship.py::test_kill_9_twenty_times",
    "test_ship_errors.py::test_bad_credentials_and_access_denied_are_permanent",
    "test_ship_errors.py::test_missing_bucket_fails_at_once_then_ships_exactly_once",
    "test_stream_limits.py::test_max_streams_holds_across_processes",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    listed = set()
    for item in items:
        path = item.path.relative_to(Path(__file__).parent)
        marks = {MARK_BY_FIXTURE[f] for f in getattr(item, "fixturenames", ()) if f in MARK_BY_FIXTURE}
        if "spark" in path.name:
            marks.add("spark")
        if path.parts[0] == "powercut":
            marks.add("fuse")
        name = f"{path}::{item.originalname if isinstance(item, pytest.Function) else item.name}"
        if name in SLOW:
            marks.add("slow")
            listed.add(name)
        for mark in sorted(marks):
            item.add_marker(mark)
    collected = {str(item.path.relative_to(Path(__file__).parent)) for item in items}
    stale = {n for n in SLOW - listed if n.split("::")[0] in collected}
    if stale:
        raise pytest.UsageError(f"tests/conftest.py SLOW names tests that do not exist: {sorted(stale)}")


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def log(data_dir: Path) -> Iterator[Log]:
    with Log(data_dir, SMALL) as opened:
        yield opened


@pytest.fixture
def moto_s3() -> Iterator[str]:
    """A local S3 (moto's server) on 127.0.0.1; the endpoint URL."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
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
    """One SparkSession for the whole run (starting one costs seconds)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from spark_jobs.session import spark_session

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
