"""A real S3 endpoint for integration tests: OpenStack Swift (Debian's packages) with
its s3api middleware and tempauth, on 127.0.0.1.

    with SwiftS3Server() as s3:
        os.environ.update(s3.env())      # boto3 / pyarrow now talk to Swift

Design:

* The packages come from ``scripts/install-swift.sh`` (run on demand, serialised by a
  lock file). If they cannot be installed, ``SwiftUnavailable`` says why, so a test can
  skip; once installed, any failure to come up is a ``SwiftStartupError`` (a real
  failure, with the tails of the servers' logs).
* Every instance writes a complete single-node cluster into its own temporary
  directory (swift.conf, rings, one device, four server configs) instead of
  /etc/swift: no root needed, no clash with a parallel run or the packaged units, and
  nothing left behind. Ports are picked free at start-up; a run that loses a port race
  is retried once with new ports.
* The servers run under the system interpreter of the Swift packages (not the venv)
  from this very file (``python3 -I swift_server.py serve ...``): Swift 2.30 reads
  swift.conf from a hard-coded /etc/swift path, so the launcher points it at the
  private directory before the WSGI server loads. ``workers = 0`` keeps each server a
  single process, which dies with SIGTERM or with its parent (PR_SET_PDEATHSIG:
  start the fixture from a thread that outlives it, e.g. the main thread).
* Logs: Swift logs to syslog by default. The launcher replaces the syslog handler by
  nothing and turns on Swift's console logging, so every line (and any traceback)
  lands in ``log/<server>.log`` of the temporary directory.
* The proxy pipeline is the s3api one: ``s3api`` before ``tempauth`` (S3 access key
  ``test:tester`` is tempauth's account:user, the secret its password; ``.admin``
  makes it the account owner, ``account_autocreate`` creates the account on first
  use), ``slo`` after them for multipart uploads, ``copy`` for CopyObject. tempauth
  needs a ``swift.cache``: rather than a memcached shared between runs, the ``cache``
  filter is a small in-process cache (the proxy is a single process).
* Clients: s3api 2.30 predates the CRC "flexible checksums" of current SDKs. pyarrow's
  AWS C++ SDK otherwise uploads parts as aws-chunked bodies with trailers (501 from
  s3api), hence ``AWS_REQUEST_CHECKSUM_CALCULATION=WHEN_REQUIRED`` (and the response
  counterpart) in ``env()``. DeleteObjects (boto3's delete_objects, pyarrow's
  delete_dir) carries a CRC32 instead of the Content-MD5 that s3api 2.30 demands and
  is refused: the project deletes objects one by one, and this server is left stock
  so that the tests see what a real Swift does. Addressing is path style (no
  ``storage_domain``); boto3 uses it by itself for an IP endpoint.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import functools
import hashlib
import hmac
import http.client
import json
import math
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from email.utils import formatdate
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, Iterator, Self

REPO = Path(__file__).resolve().parent.parent
INSTALLER = REPO / "scripts" / "install-swift.sh"
SERVERS = ("account", "container", "object", "proxy")
BINARIES = tuple(f"swift-{name}-server" for name in SERVERS)
LAUNCHER_MODULE = "comet_swift_launcher"  # how the proxy config names this file's filters
DEVICE = "d1"
PART_POWER = 6
HOST = "127.0.0.1"


class SwiftUnavailable(RuntimeError):
    """Swift cannot be installed here (no apt, no root/sudo, no network, no xattrs)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class SwiftStartupError(RuntimeError):
    """Swift is installed but the cluster did not come up; the message has the log tails."""


class _PortTaken(SwiftStartupError):
    pass


# --------------------------------------------------------------------------- install


def _system_python() -> str:
    """The interpreter of the Debian scripts (their shebang), not the venv's."""
    script = shutil.which(BINARIES[-1])
    if script:
        with open(script, "rb") as f:
            first = f.readline().decode(errors="replace")
        if first.startswith("#!"):
            parts = first[2:].split()
            if parts and os.access(parts[0], os.X_OK):
                return parts[0]
    return "/usr/bin/python3"


def _installed() -> bool:
    return all(shutil.which(b) for b in BINARIES)


@contextlib.contextmanager
def _install_lock() -> Iterator[None]:
    """One installer at a time on this machine (parallel test runs); best effort."""
    path = Path(tempfile.gettempdir()) / "comet-install-swift.lock"
    try:
        f = open(path, "a")
    except OSError:
        yield
        return
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def ensure_swift_installed(timeout: float = 900.0) -> str:
    """Installs the packages if needed; returns the interpreter to run Swift with."""
    if not _installed():
        with _install_lock():
            if not _installed():
                _run_installer(timeout)
        if not _installed():
            raise SwiftUnavailable(f"{INSTALLER.name} succeeded but {', '.join(BINARIES)} not all on PATH")
    return _system_python()


def _run_installer(timeout: float) -> None:
    if not INSTALLER.exists():
        raise SwiftUnavailable(f"{INSTALLER} is missing")
    try:
        done = subprocess.run(["bash", str(INSTALLER)], stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SwiftUnavailable(f"{INSTALLER.name} did not finish in {timeout:.0f} s") from None
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip()[-2000:]
        raise SwiftUnavailable(f"{INSTALLER.name} failed (exit {done.returncode}): {output}")


# --------------------------------------------------------------------------- layout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _supports_xattrs(directory: Path) -> bool:
    """Swift's object server keeps metadata in user xattrs (tmpfs before Linux 6.6 has none)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory) as f:
            os.setxattr(f.name, "user.comet.probe", b"1")
        return True
    except OSError:
        return False


def _scratch_base(base_dir: Path | None) -> Path:
    candidates = [base_dir] if base_dir else [Path(tempfile.gettempdir()), REPO / ".swift-tmp"]
    for candidate in candidates:
        if _supports_xattrs(candidate):
            return candidate
    raise SwiftUnavailable(f"no directory with user xattr support among {', '.join(map(str, candidates))}")


def _conf(sections: dict[str, dict[str, object]]) -> str:
    out: list[str] = []
    for name, options in sections.items():
        out.append(f"[{name}]")
        out.extend(f"{key} = {value}" for key, value in options.items())
        out.append("")
    return "\n".join(out)


def _use(name: str) -> dict[str, object]:
    return {"use": f"egg:swift#{name}"}


# --------------------------------------------------------------------------- server


class SwiftS3Server:
    """A private single-node Swift cluster with an S3 API; a context manager."""

    access_key = "test:tester"  # tempauth account:user
    secret_key = "testing"      # that user's password
    region = "us-east-1"        # s3api's `location`; SigV4 signs with it

    def __init__(self, *, base_dir: str | os.PathLike[str] | None = None,
                 startup_timeout: float = 60.0, install_timeout: float = 900.0) -> None:
        self._base_dir = Path(base_dir) if base_dir is not None else None
        self.startup_timeout = startup_timeout
        self.install_timeout = install_timeout
        self.workdir: Path | None = None
        self.ports: dict[str, int] = {}
        self.startup_seconds = 0.0
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._python = ""

    # ---- public surface

    @property
    def port(self) -> int:
        return self.ports["proxy"]

    @property
    def endpoint(self) -> str:
        """host:port, the form pyarrow's ``endpoint_override`` takes (with scheme="http")."""
        return f"{HOST}:{self.port}"

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.endpoint}"

    def env(self) -> dict[str, str]:
        """AWS_* variables that point boto3, the AWS CLI and pyarrow at this server."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_REGION": self.region,
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_REQUEST_CHECKSUM_CALCULATION": "WHEN_REQUIRED",
            "AWS_RESPONSE_CHECKSUM_VALIDATION": "WHEN_REQUIRED",
            "AWS_EC2_METADATA_DISABLED": "true",  # no instance-metadata probes from the SDKs
        }

    def pyarrow_options(self) -> dict[str, Any]:
        """Keyword arguments for ``pyarrow.fs.S3FileSystem``."""
        return {"access_key": self.access_key, "secret_key": self.secret_key,
                "endpoint_override": self.endpoint, "scheme": "http", "region": self.region}

    def log_tails(self, lines: int = 15, *, focus: str | None = None) -> str:
        """The last lines of the servers' logs (of `focus`'s, 80 of them, last)."""
        if self.workdir is None:
            return ""
        names = [name for name in (*SERVERS, "rings") if name != focus] + ([focus] if focus else [])
        parts = []
        for name in names:
            path = self.workdir / "log" / f"{name}.log"
            if path.exists():
                text = path.read_text(errors="replace").splitlines()[-(80 if name == focus else lines):]
                parts.append(f"--- {path.name} ---\n" + "\n".join(text))
        return "\n".join(parts)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> Self:
        began = time.monotonic()
        self._python = ensure_swift_installed(self.install_timeout)
        base = _scratch_base(self._base_dir)
        for attempt in (1, 2):
            try:
                self._start_once(base)
                break
            except _PortTaken:
                self.stop()
                if attempt == 2:
                    raise
            except BaseException:
                self.stop()
                raise
        self.startup_seconds = time.monotonic() - began
        return self

    def stop(self) -> None:
        """Terminates the servers (SIGTERM, then SIGKILL) and removes the directory."""
        procs, self._procs = self._procs, {}
        for proc in procs.values():
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    # ---- start-up

    def _start_once(self, base: Path) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="comet-swift-", dir=base))
        self.ports = {name: _free_port() for name in SERVERS}
        etc = self.workdir / "etc"
        for sub in ("etc", "log", "cache", f"srv/{DEVICE}"):
            (self.workdir / sub).mkdir(parents=True)
        self._write_configs(etc)
        deadline = time.monotonic() + self.startup_timeout
        for name in SERVERS:
            if name == "proxy":  # the storage servers never read the rings, the proxy does
                self._build_rings(etc, deadline)
            self._procs[name] = self._launch(name, "serve", str(etc), f"{name}-server",
                                             str(etc / f"{name}-server.conf"))
        for name in SERVERS:
            self._wait_until(deadline, f"{name} server answers /healthcheck",
                             functools.partial(_healthy, self.ports[name]))
        self._wait_until(deadline, "S3 ListBuckets as test:tester", self._s3_ready)

    def _launch(self, log_name: str, *args: str) -> subprocess.Popen[bytes]:
        assert self.workdir is not None
        with open(self.workdir / "log" / f"{log_name}.log", "ab") as log:
            # -I: neither the venv's PYTHON* variables nor tests/ on sys.path.
            # EVENTLET_NO_GREENDNS: everything is 127.0.0.1; halves the start-up time.
            return subprocess.Popen([self._python, "-I", str(Path(__file__).resolve()), *args,
                                     "--parent", str(os.getpid())],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    env={**os.environ, "EVENTLET_NO_GREENDNS": "yes"},
                                    start_new_session=True)

    def _build_rings(self, etc: Path, deadline: float) -> None:
        proc = self._launch("rings", "rings", str(etc), HOST, str(self.ports["account"]),
                            str(self.ports["container"]), str(self.ports["object"]))
        try:
            rc = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
            raise SwiftStartupError(f"timed out after {self.startup_timeout:g} s building the rings\n"
                                    f"{self.log_tails(focus='rings')}") from None
        if rc != 0:
            raise SwiftStartupError(f"building the rings failed (exit {rc}):\n{self.log_tails(focus='rings')}")

    def _wait_until(self, deadline: float, what: str, ready: Callable[[], bool]) -> None:
        while True:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    tails = self.log_tails(focus=name)
                    kind = _PortTaken if ("Address already in use" in tails or "Could not bind" in tails) \
                        else SwiftStartupError
                    raise kind(f"swift {name} server exited with {proc.returncode} before: {what}\n{tails}")
            with contextlib.suppress(OSError, http.client.HTTPException):
                if ready():
                    return
            if time.monotonic() > deadline:
                raise SwiftStartupError(f"timed out after {self.startup_timeout:g} s waiting for: {what}\n"
                                        f"{self.log_tails()}")
            time.sleep(0.1)

    def _s3_ready(self) -> bool:
        """A signed (V2, the shortest to write) GET / through s3api, tempauth and the account server."""
        date = formatdate(usegmt=True)
        digest = hmac.new(self.secret_key.encode(), f"GET\n\n\n{date}\n/".encode(), hashlib.sha1).digest()
        status, body = _get(self.port, "/", {
            "Date": date, "Authorization": f"AWS {self.access_key}:{base64.b64encode(digest).decode()}"})
        return status == 200 and b"ListAllMyBucketsResult" in body

    def _write_configs(self, etc: Path) -> None:
        assert self.workdir is not None
        (etc / "swift.conf").write_text(_conf({
            "swift-hash": {"swift_hash_path_prefix": secrets.token_hex(8),
                           "swift_hash_path_suffix": secrets.token_hex(8)},
            "storage-policy:0": {"name": "Policy-0", "default": "yes"},
        }))
        try:
            import pwd
            user = pwd.getpwuid(os.getuid()).pw_name
        except (ImportError, KeyError):
            user = os.environ.get("USER", "root")
        for name in SERVERS:
            common: dict[str, object] = {
                "bind_ip": HOST, "bind_port": self.ports[name], "bind_timeout": 1,
                "workers": 0, "user": user, "swift_dir": etc,
                "devices": self.workdir / "srv", "mount_check": "false",
                "disable_fallocate": "true", "fallocate_reserve": 0,  # never a 507 on a tight CI disk
                "recon_cache_path": self.workdir / "cache",
                "log_name": f"{name}-server", "log_level": "INFO",
            }
            if name == "proxy":
                sections = self._proxy_sections()
            else:
                sections = {"pipeline:main": {"pipeline": f"healthcheck {name}-server"},
                            f"app:{name}-server": _use(name), "filter:healthcheck": _use("healthcheck")}
            (etc / f"{name}-server.conf").write_text(_conf({"DEFAULT": common, **sections}))

    def _proxy_sections(self) -> dict[str, dict[str, object]]:
        pipeline = ("catch_errors gatekeeper healthcheck proxy-logging cache listing_formats "
                    "s3api tempauth copy slo dlo versioned_writes proxy-logging "
                    "proxy-server")
        account, user = self.access_key.split(":")
        return {
            "pipeline:main": {"pipeline": pipeline},
            "app:proxy-server": {**_use("proxy"), "account_autocreate": "true",
                                 "conn_timeout": 2, "node_timeout": 30},
            "filter:s3api": {**_use("s3api"), "location": self.region},
            "filter:tempauth": {**_use("tempauth"), f"user_{account}_{user}": f"{self.secret_key} .admin"},
            "filter:cache": {"paste.filter_factory": f"{LAUNCHER_MODULE}:memory_cache_filter"},
            "filter:catch_errors": _use("catch_errors"),
            "filter:gatekeeper": _use("gatekeeper"),
            "filter:healthcheck": _use("healthcheck"),
            "filter:proxy-logging": _use("proxy_logging"),
            "filter:listing_formats": _use("listing_formats"),
            "filter:copy": _use("copy"),
            "filter:slo": _use("slo"),
            "filter:dlo": _use("dlo"),
            "filter:versioned_writes": _use("versioned_writes"),
        }


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)  # start_new_session: the group is the server's alone


def _healthy(port: int) -> bool:
    return _get(port, "/healthcheck")[0] == 200


def _get(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(HOST, port, timeout=2)
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


# --------------------------------------------------------------------------- launcher
# Everything below runs in the Swift processes, under the system python3.


class _MemoryCache:
    """The part of swift.common.memcached.MemcacheRing that the proxy and tempauth use,
    in memory. Values are stored serialised, as memcached would, so callers never share
    (and mutate) one object."""

    def __init__(self) -> None:
        self._items: dict[str, tuple[float, Any, bool]] = {}

    @staticmethod
    def _expires(ttl: float) -> float:
        if not ttl:
            return math.inf
        return ttl if ttl > 30 * 24 * 3600 else time.time() + ttl  # memcached's convention

    # `time` (the TTL) is MemcacheRing's keyword; callers pass it by name.
    def set(self, key: str, value: Any, serialize: bool = True, time: float = 0,
            *_args: Any, **_kwargs: Any) -> None:
        self._items[key] = (self._expires(time), json.dumps(value) if serialize else value, serialize)

    def get(self, key: str, *_args: Any, **_kwargs: Any) -> Any:
        item = self._items.get(key)
        if item is None:
            return None
        expires, value, serialized = item
        if expires <= time.time():
            del self._items[key]
            return None
        return json.loads(value) if serialized else value

    def incr(self, key: str, delta: int = 1, time: float = 0, *_args: Any, **_kwargs: Any) -> int:
        current = self.get(key)
        value = max(0, int(current or 0) + delta)
        self.set(key, value, serialize=True, time=time)
        return value

    def decr(self, key: str, delta: int = 1, time: float = 0, *_args: Any, **_kwargs: Any) -> int:
        return self.incr(key, -delta, time)

    def delete(self, key: str, *_args: Any, **_kwargs: Any) -> None:
        self._items.pop(key, None)

    def get_multi(self, keys: list[str], server_key: str, *_args: Any, **_kwargs: Any) -> list[Any]:
        return [self.get(key) for key in keys]

    def set_multi(self, mapping: dict[str, Any], server_key: str, serialize: bool = True,
                  time: float = 0, *_args: Any, **_kwargs: Any) -> None:
        for key, value in mapping.items():
            self.set(key, value, serialize, time)


WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Any]


def memory_cache_filter(global_conf: dict[str, str], **local_conf: str) -> Callable[[WSGIApp], WSGIApp]:
    """paste.deploy filter factory: puts one _MemoryCache into every request's environ."""
    cache = _MemoryCache()

    def make(app: WSGIApp) -> WSGIApp:
        def middleware(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
            environ["swift.cache"] = cache
            return app(environ, start_response)
        return middleware
    return make


def _die_with_parent(parent: int) -> None:
    import ctypes
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before prctl
        os._exit(1)


def _use_swift_dir(swift_dir: str) -> None:
    """Swift 2.30 reads /etc/swift/swift.conf (hash salt, storage policies, constraints)
    wherever swift_dir points the rings; switch it to the private directory."""
    from swift.common import utils
    utils.set_swift_dir(swift_dir)
    from swift.common import constraints, storage_policy
    storage_policy.reload_storage_policies()
    constraints.reload_constraints()


def _no_syslog() -> None:
    """Swift adds a syslog handler to every logger; make it a no-op (the console handler
    that run_wsgi(verbose=True) adds writes to stderr, our log file)."""
    import logging

    from swift.common import utils

    class NoSyslog(logging.NullHandler):
        def __init__(self, *_args: Any, **_kwargs: Any) -> None:
            super().__init__()

    logs_module = sys.modules[utils.get_logger.__module__]
    logs_module.ThreadSafeSysLogHandler = NoSyslog  # type: ignore[attr-defined]


def _serve(swift_dir: str, section: str, conf: str) -> int:
    sys.modules.setdefault(LAUNCHER_MODULE, sys.modules[__name__])  # for paste.filter_factory
    _use_swift_dir(swift_dir)
    _no_syslog()
    from swift.common.wsgi import run_wsgi
    options: dict[str, Any] = {"verbose": True}
    if section == "object-server":
        from swift.obj import server
        options["global_conf_callback"] = server.global_conf_callback
    return int(run_wsgi(conf, section, **options) or 0)


def _rings(swift_dir: str, host: str, account: str, container: str, obj: str) -> int:
    """swift-ring-builder create / add / rebalance for the three rings, in one
    interpreter (nine separate runs cost ~1 s each)."""
    _use_swift_dir(swift_dir)
    from swift.cli import ringbuilder
    for kind, port in (("account", account), ("container", container), ("object", obj)):
        builder = os.path.join(swift_dir, f"{kind}.builder")
        for command in (["create", str(PART_POWER), "1", "1"],   # 2**6 partitions, 1 replica
                        ["add", f"r1z1-{host}:{port}/{DEVICE}", "100"],
                        ["rebalance"]):
            print("swift-ring-builder", builder, *command, flush=True)
            try:
                ringbuilder.main(["swift-ring-builder", builder, *command])
            except SystemExit as e:
                if e.code not in (None, 0, 1):  # 1 = done with warnings
                    return int(e.code) if isinstance(e.code, int) else 2
    return 0


def _main(argv: list[str]) -> int:
    parent = int(argv[argv.index("--parent") + 1])
    args = argv[:argv.index("--parent")]
    _die_with_parent(parent)
    command, rest = args[0], args[1:]
    if command == "serve":
        return _serve(*rest)
    if command == "rings":
        return _rings(*rest)
    print(f"unknown command {command!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
