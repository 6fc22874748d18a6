"""comet ship's failures: permanent errors end a --once run at once with one
line and exit 3, --max-retries ends a run with exit 4, continuous runs retry
and count, a killed run's temporary files are removed by the next one.  In
every case nothing unstored is acknowledged and a rerun ships exactly once."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Callable, Iterator

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

from consumers import (Consumer, DirectorySink, S3Sink, ShipConfig, ShipError, Shipper, SinkError,
                       classify)
from consumers.errors import EXIT_PERMANENT, EXIT_RETRIES
from comet.jsonlog import JsonFormatter
from storage_c import Log

from .support.processes import REPO
from .support.server import COMET
from .support.ship import CFG, check_objects, fill_shards

FAST = ShipConfig(retry_backoff_s=0.01, max_backoff_s=0.05)


# ---- helpers -------------------------------------------------------------------------

def ship(data_dir: Path, sink: str, *extra: str, env: dict[str, str] | None = None,
         timeout: float = 60) -> tuple[int, list[str], float]:
    """Runs ``comet ship <data> ev <sink> --once ...``: exit status, stderr lines, seconds."""
    started = time.monotonic()
    out = subprocess.run([str(COMET), "ship", str(data_dir), "ev", sink, "--once", *extra],
                         capture_output=True, text=True, timeout=timeout, env=env)
    return out.returncode, out.stderr.splitlines(), time.monotonic() - started


def offsets(data_dir: Path) -> list[int]:
    """The ship group's offset per shard (0 where it never acknowledged)."""
    with Log(data_dir, CFG) as log:
        found = {g.shard: g.offset for g in log.groups("ev") if g.name == "ship"}
    return [found.get(shard, 0) for shard in range(4)]


def temp_files(*roots: Path) -> list[Path]:
    return sorted(p for root in roots if root.exists() for p in root.rglob(".*.tmp"))


def assert_one_error_line(lines: list[str], *needles: str) -> str:
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith("Error: comet ship: cannot store objects in "), line
    assert "Traceback" not in line
    for needle in needles:
        assert needle in line, (needle, line)
    assert "then run again" in line
    return line


class FakeSink(DirectorySink):
    """A directory that fails its first ``failures`` puts with ``error()``."""

    def __init__(self, root: Path, error: BaseException | Callable[[], BaseException],
                 failures: int = 10**9) -> None:
        super().__init__(root)
        self.error = error
        self.failures = failures
        self.calls = 0

    def put(self, key: str, data: bytes) -> None:
        self.calls += 1
        if self.failures:
            self.failures -= 1
            raise self.error() if callable(self.error) else self.error
        super().put(key, data)


def moto_api(url: str, path: str, body: bytes = b"") -> None:
    urllib.request.urlopen(urllib.request.Request(
        f"{url}/moto-api/{path}", data=body, method="POST",
        headers={"Content-Type": "text/plain"}), timeout=10).close()


def client_error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": f"{code} says the store"},
                        "ResponseMetadata": {"HTTPStatusCode": status}},  # type: ignore[typeddict-item]  # enough for botocore
                       "PutObject")


# ---- S3: a bucket that does not exist, bad credentials, a bad name -----------------------

@pytest.mark.slow
def test_missing_bucket_fails_at_once_then_ships_exactly_once(moto_s3: str, data_dir: Path,
                                                              aws_env: None) -> None:
    import boto3

    moto_api(moto_s3, "reset")  # moto's state is per process: start from nothing
    with Log(data_dir, CFG) as log:
        fill_shards(log, 300)
    args = ("--endpoint-url", moto_s3, "--max-object-bytes", "20000")
    rc, lines, seconds = ship(data_dir, "s3://missing/lake", *args)
    assert rc == EXIT_PERMANENT
    assert_one_error_line(lines, "s3://missing/lake", "NoSuchBucket", "Create bucket missing")
    assert seconds < 10
    assert offsets(data_dir) == [0, 0, 0, 0]  # nothing acknowledged
    assert list((data_dir / ".ship" / "ship" / "ev").glob("shard-*.intent"))  # the object to redo

    boto3.client("s3", endpoint_url=moto_s3).create_bucket(Bucket="missing")
    rc, lines, _ = ship(data_dir, "s3://missing/lake", *args)
    assert rc == 0, lines
    sink = S3Sink("missing", "lake", endpoint_url=moto_s3)
    with Log(data_dir, CFG) as log:
        assert check_objects(log, sink) == 1200  # no gap, no overlap, offsets at the end
    stopped = json.loads(lines[-1])
    assert stopped["event"] == "stopped" and stopped["upload_errors"] == 0


@pytest.fixture
def moto_auth(moto_s3: str, aws_env: None) -> Iterator[dict[str, object]]:
    """moto with authentication on: bucket ``edge``, a user ``shipper``
    without any policy, an ``admin`` allowed everything; their keys."""
    import boto3

    moto_api(moto_s3, "reset")  # moto's state is per process: start from nothing
    iam = boto3.client("iam", endpoint_url=moto_s3)
    boto3.client("s3", endpoint_url=moto_s3).create_bucket(Bucket="edge")
    keys: dict[str, object] = {"url": moto_s3}
    for user in ("shipper", "admin"):
        iam.create_user(UserName=user)
        keys[user] = iam.create_access_key(UserName=user)["AccessKey"]
    iam.put_user_policy(UserName="admin", PolicyName="all", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))

    moto_api(moto_s3, "reset-auth", b"0")  # from now on every request is authenticated
    try:
        yield keys
    finally:
        moto_api(moto_s3, "reset-auth", b"inf")


def aws(url: str, access_key: str | None, secret: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL=url, AWS_MAX_ATTEMPTS="1",
               AWS_CONFIG_FILE="/nonexistent", AWS_SHARED_CREDENTIALS_FILE="/nonexistent",
               AWS_EC2_METADATA_DISABLED="true")
    if access_key is not None and secret is not None:
        env.update(AWS_ACCESS_KEY_ID=access_key, AWS_SECRET_ACCESS_KEY=secret)
    return env


@pytest.mark.slow
def test_bad_credentials_and_access_denied_are_permanent(moto_auth: dict, data_dir: Path) -> None:
    import boto3

    url = moto_auth["url"]
    shipper, admin = moto_auth["shipper"], moto_auth["admin"]
    with Log(data_dir, CFG) as log:
        fill_shards(log, 100)
    cases = [
        (aws(url, "AKIAIOSFODNN7WRONG00", "x"), "InvalidAccessKeyId", "AWS_ACCESS_KEY_ID"),
        (aws(url, shipper["AccessKeyId"], "wrong"), "SignatureDoesNotMatch", "AWS_SECRET_ACCESS_KEY"),
        (aws(url, shipper["AccessKeyId"], shipper["SecretAccessKey"]), "AccessDenied",
         "Allow s3:PutObject on arn:aws:s3:::edge/lake/*"),
        (aws(url, None, None), "NoCredentialsError", "AWS_ACCESS_KEY_ID"),
    ]
    for env, code, hint in cases:
        rc, lines, seconds = ship(data_dir, "s3://edge/lake", env=env)
        assert rc == EXIT_PERMANENT, (code, lines)
        assert_one_error_line(lines, "s3://edge/lake", code, hint)
        assert seconds < 10, code
        assert offsets(data_dir) == [0, 0, 0, 0], code

    as_admin = dict(endpoint_url=url, aws_access_key_id=admin["AccessKeyId"],
                    aws_secret_access_key=admin["SecretAccessKey"], region_name="us-east-1")
    assert "Contents" not in boto3.client("s3", **as_admin).list_objects_v2(Bucket="edge")
    boto3.client("iam", **as_admin).put_user_policy(
        UserName="shipper", PolicyName="put", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [
                {"Effect": "Allow", "Action": "s3:PutObject", "Resource": "arn:aws:s3:::edge/lake/*"}]}))
    rc, lines, _ = ship(data_dir, "s3://edge/lake",
                        env=aws(url, shipper["AccessKeyId"], shipper["SecretAccessKey"]))
    assert rc == 0, lines
    sink = S3Sink("edge", "lake", client=boto3.client("s3", **as_admin))
    with Log(data_dir, CFG) as log:
        assert check_objects(log, sink) == 400


def test_invalid_bucket_name(data_dir: Path) -> None:
    with Log(data_dir, CFG) as log:
        fill_shards(log, 10)
    rc, lines, seconds = ship(data_dir, "s3://no!such_name/lake")
    assert rc == EXIT_PERMANENT
    assert lines == ["Error: comet ship: s3://no!such_name/: 'no!such_name' is not a valid bucket "
                     "name: fix the bucket name in the sink URL"]
    assert seconds < 10
    assert offsets(data_dir) == [0, 0, 0, 0]
    # a name botocore lets through and the store refuses
    failure = classify(client_error("InvalidBucketName", 400))
    assert failure.permanent and "fix the bucket name" in failure.hint


# ---- directory sinks ------------------------------------------------------------------

def test_directory_sink_that_is_a_file(data_dir: Path, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    lake.write_text("not a directory")
    with Log(data_dir, CFG) as log:
        fill_shards(log, 100)
    rc, lines, seconds = ship(data_dir, str(lake))
    assert rc == EXIT_PERMANENT
    assert_one_error_line(lines, f"directory {lake}", "ENOTDIR",
                          f"{lake} is a file where a directory belongs")
    assert seconds < 10
    assert offsets(data_dir) == [0, 0, 0, 0]
    lake.unlink()
    rc, lines, _ = ship(data_dir, str(lake))
    assert rc == 0, lines
    with Log(data_dir, CFG) as log:
        assert check_objects(log, DirectorySink(lake)) == 400


def test_directory_sink_not_writable(data_dir: Path, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    lake.mkdir()
    lake.chmod(0o555)
    with Log(data_dir, CFG) as log:
        fill_shards(log, 100)
    prefix: list[str] = []
    if os.geteuid() == 0:  # root writes anywhere: run without the capabilities that allow it
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv")
        prefix = [setpriv, "--bounding-set", "-dac_override,-dac_read_search"]
    started = time.monotonic()
    out = subprocess.run([*prefix, str(COMET), "ship", str(data_dir), "ev", str(lake), "--once"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == EXIT_PERMANENT, out.stderr
    assert_one_error_line(out.stderr.splitlines(), f"directory {lake}", "EACCES",
                          f"Make {lake} and the directories under it writable")
    assert time.monotonic() - started < 10
    assert offsets(data_dir) == [0, 0, 0, 0]
    assert list(lake.iterdir()) == []
    lake.chmod(0o755)
    rc, lines, _ = ship(data_dir, str(lake))
    assert rc == 0, lines
    with Log(data_dir, CFG) as log:
        assert check_objects(log, DirectorySink(lake)) == 400


# ---- retries: --max-retries, continuous mode --------------------------------------------

def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_max_retries_ends_a_run_on_a_transient_error(data_dir: Path, tmp_path: Path,
                                                     aws_env: None) -> None:
    with Log(data_dir, CFG) as log:
        fill_shards(log, 100)
    # a real process against an endpoint nobody listens on: connection refused
    url = f"http://127.0.0.1:{closed_port()}"
    env = dict(os.environ, AWS_MAX_ATTEMPTS="1")
    rc, lines, seconds = ship(data_dir, "s3://edge/lake", "--endpoint-url", url,
                              "--max-retries", "2", env=env)
    assert rc == EXIT_RETRIES
    failed = [json.loads(line) for line in lines[:-1]]
    assert [f["retry"] for f in failed] == [0, 1]  # every retried failure is logged...
    assert all(f["event"] == "upload_failed" and f["code"] == "EndpointConnectionError"
               and f["permanent"] is False for f in failed)
    assert_one_error_line(lines[-1:], "s3://edge/lake", "EndpointConnectionError",
                          "still failing after 3 attempts (--max-retries 2)")  # ...and the last ends it
    assert seconds < 15
    assert offsets(data_dir) == [0, 0, 0, 0]

    # a fake sink that throttles: the same in-process, continuous mode
    sink = FakeSink(tmp_path / "lake", lambda: client_error("SlowDown", 503))
    with Log(data_dir, CFG) as log, Consumer(log, "ev", "ship") as c:
        shipper = Shipper(c, sink, ShipConfig(retry_backoff_s=0.01, max_retries=3,
                                              max_object_age_s=0))
        with pytest.raises(ShipError) as caught:
            shipper.run()
        assert caught.value.exit_code == EXIT_RETRIES
        assert sink.calls == 4 and shipper.stats.transient_errors == 4
        assert "SlowDown" in str(caught.value) and "\n" not in str(caught.value)
        assert all(c.offset(s) == 0 for s in range(4))
        assert sink.keys() == []
    # fixed: the rerun ships everything once
    with Log(data_dir, CFG) as log, Consumer(log, "ev", "ship") as c:
        Shipper(c, DirectorySink(tmp_path / "lake")).run(once=True)
        assert check_objects(log, DirectorySink(tmp_path / "lake")) == 400


def test_once_retries_transient_errors_five_times_and_permanent_ones_never(
        data_dir: Path, tmp_path: Path) -> None:
    with Log(data_dir, CFG) as log:
        fill_shards(log, 50)
        transient = FakeSink(tmp_path / "a", lambda: ConnectionResetError(104, "reset by peer"))
        with Consumer(log, "ev", "ship") as c, pytest.raises(ShipError) as caught:
            Shipper(c, transient, FAST).run(once=True)
        assert transient.calls == 6 and caught.value.exit_code == EXIT_RETRIES
        permanent = FakeSink(tmp_path / "b", lambda: client_error("AccessDenied", 403))
        with Consumer(log, "ev", "ship") as c, pytest.raises(ShipError) as caught:
            Shipper(c, permanent, FAST).run(once=True)
        assert permanent.calls == 1 and caught.value.exit_code == EXIT_PERMANENT
        assert [g.offset for g in log.groups("ev") if g.name == "ship"] == [0, 0, 0, 0]
        flaky = FakeSink(tmp_path / "c", lambda: client_error("InternalError", 500), failures=5)
        with Consumer(log, "ev", "ship") as c:
            stats = Shipper(c, flaky, FAST).run(once=True)  # 5 retries are allowed
        assert stats.transient_errors == 5 and stats.failing == 0
        assert check_objects(log, flaky) == 200


def test_continuous_mode_retries_permanent_errors_and_counts_them(
        data_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="comet.ship")
    sink = FakeSink(tmp_path / "lake", lambda: client_error("AccessDenied", 403), failures=4)
    with Log(data_dir, CFG) as log:
        fill_shards(log, 100)
        with Consumer(log, "ev", "ship") as c:
            shipper = Shipper(c, sink, ShipConfig(retry_backoff_s=0.05, max_backoff_s=0.1,
                                                  max_object_age_s=0, status_interval_s=0.02))
            stats = shipper.run(lambda: len(sink.keys()) == 4 and shipper.stats.failing == 0)
        assert (stats.upload_errors, stats.permanent_errors, stats.transient_errors) == (4, 4, 0)
        assert check_objects(log, sink) == 400
    lines = [json.loads(JsonFormatter().format(r)) for r in caplog.records]
    failed = [x for x in lines if x["event"] == "upload_failed"]
    assert [x["retry"] for x in failed] == [0, 1, 2, 3]
    assert all(x["permanent"] and x["code"] == "AccessDenied" for x in failed)
    status = [x for x in lines if x["event"] == "status"]
    assert any(x["failing"] > 0 and x["permanent_errors"] > 0
               and x["last_error"].startswith("AccessDenied") for x in status)
    assert {"objects", "entries", "upload_errors", "lag", "last_shipped"} <= set(status[0])


def test_continuous_cli_logs_status_and_stops_on_sigterm(
        data_dir: Path, tmp_path: Path, children: list[subprocess.Popen[bytes]]) -> None:
    lake = tmp_path / "lake"
    lake.write_text("a file")
    with Log(data_dir, CFG) as log:
        fill_shards(log, 20)
    proc = subprocess.Popen([str(COMET), "ship", str(data_dir), "ev", str(lake), "--max-object-age",
                             "0", "--status-interval", "0.2"], stderr=subprocess.PIPE, text=True)
    children.append(proc)  # type: ignore[arg-type]  # a text-mode one: only killed
    watchdog = threading.Timer(60, proc.kill)  # never wait for a line for ever
    watchdog.start()
    try:
        seen = []
        assert proc.stderr is not None
        for line in proc.stderr:  # keeps retrying the permanent error, and says so
            seen.append(json.loads(line))
            if seen[-1]["event"] == "status" and seen[-1]["permanent_errors"] >= 2:
                break
        proc.send_signal(signal.SIGTERM)
        rest = proc.stderr.read().splitlines()
        assert proc.wait(timeout=30) == 0
    finally:
        watchdog.cancel()
    assert seen[0]["event"] == "upload_failed" and seen[0]["code"] == "ENOTDIR"
    assert seen[-1]["failing"] >= 2 and seen[-1]["lag"] == 80
    stopped = json.loads(rest[-1])
    assert stopped["event"] == "stopped" and stopped["objects"] == 0
    assert offsets(data_dir) == [0, 0, 0, 0]


# ---- the classification ------------------------------------------------------------

@pytest.mark.parametrize("error, permanent", [
    (client_error("NoSuchBucket", 404), True),
    (client_error("AccessDenied", 403), True),
    (client_error("InvalidAccessKeyId", 403), True),
    (client_error("SignatureDoesNotMatch", 403), True),
    (client_error("ExpiredToken", 400), True),
    (client_error("SomethingNew", 400), True),
    (client_error("SlowDown", 503), False),
    (client_error("Throttling", 400), False),
    (client_error("RequestTimeout", 400), False),
    (client_error("InternalError", 500), False),
    (client_error("SomethingNew", 502), False),
    (client_error("TooManyRequests", 429), False),
    (NoCredentialsError(), True),
    (EndpointConnectionError(endpoint_url="http://x"), False),
    (PermissionError(13, "Permission denied", "/lake/x"), True),
    (NotADirectoryError(20, "Not a directory", "/lake/x"), True),
    (OSError(30, "Read-only file system", "/lake/x"), True),
    (OSError(28, "No space left on device", "/lake/x"), False),
    (OSError(5, "Input/output error", "/lake/x"), False),
    (ConnectionError("the network is down"), False),
    (TimeoutError(), False),
    (RuntimeError("?"), False),
    (SinkError("custom", permanent=True), True),
])
def test_classification(error: BaseException, permanent: bool, tmp_path: Path) -> None:
    failure = classify(error, DirectorySink(tmp_path))
    assert failure.permanent is permanent
    assert failure.code and failure.hint and "\n" not in failure.detail


# ---- temporary files of killed runs -----------------------------------------------------

# Runs `comet ship` with os.fsync blocking on the n-th temporary file whose
# path contains `needle`: the file is written, not yet renamed.  Then it
# writes `marker` (the path) and sleeps until killed.
CHILD = r"""
import os, sys, time
from comet.cli import main
marker, needle, nth = sys.argv[1], sys.argv[2], int(sys.argv[3])
real, seen = os.fsync, [0]
def fsync(fd):
    try:
        name = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        name = ""
    if needle in name and name.endswith(".tmp"):
        seen[0] += 1
        if seen[0] == nth:
            real(fd)
            with open(marker + ".part", "w") as f:
                f.write(name)
            os.rename(marker + ".part", marker)
            time.sleep(3600)
    real(fd)
os.fsync = fsync
sys.argv = ["comet", *sys.argv[4:]]
main()
"""


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts; any still running at the end is killed."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def blocked_shipper(children: list[subprocess.Popen[bytes]], tmp_path: Path, needle: Path,
                    nth: int, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
    """A shipper stopped inside the n-th write under ``needle``; the temporary file's path."""
    marker = tmp_path / f"blocked-{time.monotonic_ns()}"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(marker), str(needle), str(nth),
                             "ship", *args], stderr=subprocess.DEVNULL,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))
    children.append(proc)
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert proc.poll() is None, "the shipper ended before the write"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return proc, Path(marker.read_text())


def kill9(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def test_kill_9_mid_upload_leaves_nothing_behind(data_dir: Path, tmp_path: Path,
                                                 children: list[subprocess.Popen[bytes]]) -> None:
    lake = tmp_path / "lake"
    state = data_dir / ".ship"
    args = (str(data_dir), "ev", str(lake), "--max-object-bytes", "20000", "--once")
    with Log(data_dir, CFG) as log:
        fill_shards(log, 400)  # ~5 objects per shard

        # 1: killed while the third object's temporary file is being written
        proc, tmp1 = blocked_shipper(children, tmp_path, lake, 3, *args)
        assert tmp1.exists() and tmp1.name.endswith(f".{proc.pid}.tmp")
        # a running shipper's files are not touched, even by a shipper of the same shards
        with Consumer(log, "ev", "ship") as c:
            assert Shipper(c, DirectorySink(lake)).remove_temp_files() == 0
        assert tmp1.exists()
        kill9(proc)
        stored1 = DirectorySink(lake).keys()
        assert len(stored1) == 2 and temp_files(lake, state) == [tmp1]

        # 2: the next run removes it first; it is killed writing its third intent
        proc, tmp2 = blocked_shipper(children, tmp_path, state, 3, *args)
        assert not tmp1.exists()
        assert tmp2.parent == state / "ship" / "ev" and tmp2.name.startswith(".shard-")
        kill9(proc)
        # 3: and once more in the middle of an object
        proc, tmp3 = blocked_shipper(children, tmp_path, lake, 2, *args)
        assert not tmp2.exists()
        kill9(proc)
        assert temp_files(lake, state) == [tmp3]
        assert set(stored1) < set(DirectorySink(lake).keys())

        # the last run cleans up and ships the rest; everything once, nothing lost
        rc, lines, _ = ship(data_dir, str(lake), "--max-object-bytes", "20000")
        assert rc == 0, lines
        removed = [json.loads(x)["path"] for x in lines if "temp_file_removed" in x]
        assert removed == [str(tmp3)]
        assert temp_files(lake, state) == []
        assert check_objects(log, DirectorySink(lake)) == 1600
        assert all(g.lag == 0 for g in log.groups("ev") if g.name == "ship")


def test_a_failed_write_leaves_no_temp_file(data_dir: Path, tmp_path: Path) -> None:
    """ENOSPC in the middle of a write (transient): the partial file goes at once."""
    from comet import files

    class Full(DirectorySink):
        def put(self, key: str, data: bytes) -> None:
            real = files.os.fsync

            def no_space(fd: object) -> None:
                raise OSError(28, "No space left on device")
            files.os.fsync = no_space
            try:
                super().put(key, data)
            finally:
                files.os.fsync = real

    lake = tmp_path / "lake"
    with Log(data_dir, CFG) as log:
        fill_shards(log, 20)
        with Consumer(log, "ev", "ship") as c, pytest.raises(ShipError) as caught:
            Shipper(c, Full(lake), ShipConfig(retry_backoff_s=0.01, max_retries=1,
                                              max_object_age_s=0)).run()
        assert "ENOSPC" in str(caught.value) and "Free space" in str(caught.value)
        assert temp_files(lake) == [] and DirectorySink(lake).keys() == []
        assert [g.offset for g in log.groups("ev") if g.name == "ship"] == [0, 0, 0, 0]


def test_stop_during_retries_keeps_the_intent(data_dir: Path, tmp_path: Path) -> None:
    """SIGTERM-like stop while a permanent error is retried: the run ends
    cleanly, unacknowledged, and a rerun ships the same object once."""
    stop = threading.Event()
    sink = FakeSink(tmp_path / "lake", lambda: client_error("NoSuchBucket", 404))
    with Log(data_dir, CFG) as log:
        fill_shards(log, 30)
        with Consumer(log, "ev", "ship") as c:
            shipper = Shipper(c, sink, ShipConfig(retry_backoff_s=0.01, max_backoff_s=0.02,
                                                  stop_retries=1, max_object_age_s=0))
            threading.Timer(0.3, stop.set).start()
            stats = shipper.run(stop)
        assert stats.objects == 0 and stats.permanent_errors >= 2
        assert [g.offset for g in log.groups("ev") if g.name == "ship"] == [0, 0, 0, 0]
        with Consumer(log, "ev", "ship") as c:
            Shipper(c, DirectorySink(tmp_path / "lake")).run(once=True)
        assert check_objects(log, DirectorySink(tmp_path / "lake")) == 120
