"""A real S3 endpoint for tests/test_spark_swift.py: OpenStack Swift (Debian's packages)
with its s3api middleware and tempauth, on 127.0.0.1.

    with SwiftS3Server() as s3:
        os.environ.update(s3.env())      # boto3 / pyarrow now talk to Swift

A one-node cluster in a temporary directory (no /etc/swift, no root needed): one device,
one replica, four servers (account, container, object, proxy), each a single process
(`workers = 0`) run from this file under the packages' python3 (`python3 -I
swift_server.py DIR SERVER`), because Swift 2.30 reads /etc/swift/swift.conf unless told
otherwise, and tempauth needs a `swift.cache`: a dict in the proxy process here instead
of a memcached.  Logs: DIR/<server>.log.  The S3 access key `test:tester` is tempauth's
account:user (`.admin`: the account's owner, created on first use).

Clients: s3api 2.30 predates the CRC "flexible checksums" of current AWS SDKs (pyarrow's
would upload aws-chunked bodies with trailers: 501), hence
AWS_REQUEST_CHECKSUM_CALCULATION=WHEN_REQUIRED and its response counterpart in env().
DeleteObjects without Content-MD5 is refused, as by a real Swift 2.30: the project
deletes objects one by one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("swift", "swift-proxy", "swift-object", "swift-container", "swift-account")
SERVERS = ("account", "container", "object", "proxy")
HOST = "127.0.0.1"
PROXY_PIPELINE = ("catch_errors gatekeeper healthcheck proxy-logging cache listing_formats "
                  "s3api tempauth copy slo dlo proxy-logging proxy-server")


class SwiftUnavailable(RuntimeError):
    """Swift cannot be installed here (outside CI only: in CI that is a failure)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _ini(sections: dict[str, dict[str, object]]) -> str:
    return "".join(f"[{name}]\n" + "".join(f"{k} = {v}\n" for k, v in items.items()) + "\n"
                   for name, items in sections.items())


class SwiftS3Server:
    access_key = "test:tester"
    secret_key = "testing"
    region = "us-east-1"

    def __init__(self) -> None:
        self.dir: Path | None = None
        self.ports: dict[str, int] = {}
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def endpoint_url(self) -> str:
        return f"http://{HOST}:{self.ports['proxy']}"

    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint_url, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_DEFAULT_REGION": self.region,
                "AWS_REQUEST_CHECKSUM_CALCULATION": "WHEN_REQUIRED",
                "AWS_RESPONSE_CHECKSUM_VALIDATION": "WHEN_REQUIRED"}

    def __enter__(self) -> SwiftS3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 60) -> SwiftS3Server:
        installed = subprocess.run([str(REPO / "scripts" / "apt-install.sh"), *PACKAGES], stdin=subprocess.DEVNULL,
                                   capture_output=True, text=True, timeout=900)
        if installed.returncode != 0:
            reason = f"scripts/apt-install.sh {' '.join(PACKAGES)} failed: {installed.stderr.strip()[-2000:]}"
            in_ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
            raise (RuntimeError if in_ci else SwiftUnavailable)(reason)
        self.dir = Path(tempfile.mkdtemp(prefix="comet-swift-"))
        self.ports = {name: _free_port() for name in SERVERS}
        try:
            self._configure()
            if self._run("rings", *(str(self.ports[k]) for k in SERVERS[:3])).wait(timeout) != 0:
                raise RuntimeError(f"building Swift's rings failed:\n{self.logs()}")
            self.procs = [self._run(name) for name in SERVERS]
            self._wait_for_s3(time.monotonic() + timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)  # start_new_session: the group is the server's
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs = []
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def logs(self) -> str:
        assert self.dir is not None
        return "\n".join(f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-40:])
                         for p in sorted(self.dir.glob("*.log")))

    def _run(self, what: str, *args: str) -> subprocess.Popen[bytes]:
        assert self.dir is not None
        python = Path(shutil.which("swift-proxy-server") or "").read_text().split("\n", 1)[0][2:].split()[0]
        with open(self.dir / f"{what}.log", "ab") as log:
            # -I: neither the venv's PYTHON* variables nor tests/ on sys.path.
            # EVENTLET_NO_GREENDNS: everything is 127.0.0.1; halves the start-up time.
            return subprocess.Popen([python, "-I", __file__, str(self.dir), what, str(os.getpid()), *args],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    env={**os.environ, "EVENTLET_NO_GREENDNS": "yes"}, start_new_session=True)

    def _wait_for_s3(self, deadline: float) -> None:
        import boto3
        from botocore.config import Config

        client = boto3.client("s3", endpoint_url=self.endpoint_url, aws_access_key_id=self.access_key,
                              aws_secret_access_key=self.secret_key, region_name=self.region,
                              config=Config(retries={"max_attempts": 1}, connect_timeout=1, read_timeout=5))
        while True:
            dead = [name for name, proc in zip(SERVERS, self.procs) if proc.poll() is not None]
            if dead:
                raise RuntimeError(f"swift {', '.join(dead)} server exited:\n{self.logs()}")
            try:
                client.list_buckets()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"Swift's S3 API did not answer:\n{self.logs()}") from None
            time.sleep(0.1)

    def _configure(self) -> None:
        assert self.dir is not None
        import pwd

        (self.dir / "srv" / "d1").mkdir(parents=True)
        (self.dir / "swift.conf").write_text(_ini({
            "swift-hash": {"swift_hash_path_prefix": os.urandom(8).hex(), "swift_hash_path_suffix": "comet"},
            "storage-policy:0": {"name": "Policy-0", "default": "yes"}}))
        for name in SERVERS:
            default = {"bind_ip": HOST, "bind_port": self.ports[name], "workers": 0,
                       "user": pwd.getpwuid(os.getuid()).pw_name, "swift_dir": self.dir,
                       "devices": self.dir / "srv", "mount_check": "false", "recon_cache_path": self.dir,
                       "disable_fallocate": "true", "fallocate_reserve": 0}  # never a 507 on a tight CI disk
            sections: dict[str, dict[str, object]]
            if name != "proxy":
                sections = {"pipeline:main": {"pipeline": f"healthcheck {name}-server"},
                            f"app:{name}-server": {"use": f"egg:swift#{name}"}}
            else:
                account, user = self.access_key.split(":")
                sections = {"pipeline:main": {"pipeline": PROXY_PIPELINE},
                            "app:proxy-server": {"use": "egg:swift#proxy", "account_autocreate": "true"},
                            "filter:s3api": {"use": "egg:swift#s3api", "location": self.region},
                            "filter:tempauth": {"use": "egg:swift#tempauth",
                                                f"user_{account}_{user}": f"{self.secret_key} .admin"},
                            "filter:cache": {"paste.filter_factory": "comet_swift:cache_filter"},
                            **{f"filter:{f}": {"use": f"egg:swift#{f.replace('-', '_')}"}
                               for f in ("catch_errors", "gatekeeper", "proxy-logging", "listing_formats",
                                         "copy", "slo", "dlo")}}
            sections["filter:healthcheck"] = {"use": "egg:swift#healthcheck"}
            (self.dir / f"{name}-server.conf").write_text(_ini({"DEFAULT": default, **sections}))


# ---- what runs in the Swift processes, under the packages' python3 -------------------


class _Cache:
    """The part of Swift's MemcacheRing that the proxy and tempauth use (get, set,
    delete; `time` is the TTL, memcached's convention).  Values go
    through JSON, as through memcached, so that no caller shares a mutable object."""

    def __init__(self) -> None:
        self.items: dict[str, tuple[float, str]] = {}

    def set(self, key: str, value: Any, serialize: bool = True, time: float = 0, **_: Any) -> None:
        expires = float("inf") if not time else time if time > 30 * 86400 else _now() + time
        self.items[key] = (expires, json.dumps(value))

    def get(self, key: str, **_: Any) -> Any:
        expires, value = self.items.get(key, (0.0, "null"))
        return json.loads(value) if expires > _now() else None

    def delete(self, key: str, **_: Any) -> None:
        self.items.pop(key, None)


def _now() -> float:
    return time.time()


def cache_filter(global_conf: dict[str, str], **local_conf: str) -> Any:
    """paste.deploy filter factory: one _Cache in every request's environ."""
    cache = _Cache()

    def make(app: Any) -> Any:
        def middleware(environ: dict[str, Any], start_response: Any) -> Any:
            environ["swift.cache"] = cache
            return app(environ, start_response)
        return middleware
    return make


def _main(swift_dir: str, what: str, parent: str, *ports: str) -> int:
    import ctypes

    ctypes.CDLL(None).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG: die with the test run
    if os.getppid() != int(parent):
        return 1
    sys.modules["comet_swift"] = sys.modules[__name__]  # for the proxy's paste.filter_factory
    from swift.common import constraints, storage_policy, utils  # type: ignore[import-not-found]
    utils.set_swift_dir(swift_dir)
    storage_policy.reload_storage_policies()
    constraints.reload_constraints()
    if what == "rings":  # 2**6 partitions, one replica, one device
        from swift.common.ring import RingBuilder  # type: ignore[import-not-found]
        for kind, port in zip(SERVERS, ports):
            builder = RingBuilder(6, 1, 1)
            builder.add_dev({"id": 0, "region": 1, "zone": 1, "ip": HOST, "port": int(port),
                             "device": "d1", "weight": 100})
            builder.rebalance()
            builder.get_ring().save(os.path.join(swift_dir, f"{kind}.ring.gz"))
        return 0
    from swift.common.wsgi import run_wsgi  # type: ignore[import-not-found]
    options: dict[str, Any] = {"verbose": True}  # log to stderr, i.e. DIR/<server>.log
    if what == "object":
        from swift.obj import server  # type: ignore[import-not-found]
        options["global_conf_callback"] = server.global_conf_callback
    return int(run_wsgi(os.path.join(swift_dir, f"{what}-server.conf"), f"{what}-server", **options) or 0)


if __name__ == "__main__":
    sys.exit(_main(*sys.argv[1:]))
