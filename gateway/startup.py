"""What `comet serve`'s master checks before it forks a worker, each failure
one line (``StartError``) and exit status 1.

A mistake of an operator's first hour should stop the command at once,
saying what is wrong and what to do, rather than start a master whose
workers then fail one by one with tracebacks, or wait.  The configuration's
own checks (every setting, the TLS files, the tokens file) run when it loads
(gateway.config); what depends on the machine is checked here:

- the number of workers: each holds one of the data directory's process
  slots, of which there are at most 1,024;
- the data directory: created if missing, a directory, writable;
- that no other gateway serves it: the master takes an exclusive ``flock``
  on ``<data>/.gateway/serve.lock`` and writes its PID and address there.
  The workers inherit the lock with the descriptor, so it is free again only
  once the master and every worker have exited (a worker draining after its
  master was killed still holds slots).  A second ``comet serve`` finds it
  held and names that PID.  The kernel drops the lock however a process
  dies: a stale file never blocks a start.
- the address: the listening sockets are bound here, once (gunicorn's own
  bind retries for five seconds, then reports "Can't connect to ...", which
  reads like a client's error).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import pwd
import socket
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from comet.files import pid_alive

from .config import GatewayConfig

LOCK_NAME = "serve.lock"
WHERE_TO_CHOOSE = "--data-dir, COMET_DATA_DIR or data_dir in the configuration file"


class StartError(RuntimeError):
    """Why the gateway cannot start, in one line that says what to do."""


def check_workers(config: GatewayConfig) -> None:
    """The storage settings each worker opens with: one process slot per worker."""
    try:
        config.storage_config()
    except ValueError as exc:
        raise StartError(f"workers = {config.worker_count}: {exc} (each worker holds one of the "
                         "data directory's process slots); choose fewer (--workers, COMET_WORKERS)"
                         ) from None


class DataDirClaim:
    """The data directory, held: the lock's descriptor, and the directories
    this start created (gone again if the start fails after all)."""

    def __init__(self, path: str, fd: int, created: list[Path]) -> None:
        self.path, self.fd, self.created = path, fd, created

    def abandon(self) -> None:
        """Lets the lock go; removes what the start created, if still empty."""
        os.close(self.fd)
        remove_created(self.path, self.created)


def claim_data_dir(path: str, host: str, port: int) -> DataDirClaim:
    """The data directory made ready (prepare_data_dir) and held
    (hold_data_dir), or StartError."""
    created = prepare_data_dir(path)
    try:
        return DataDirClaim(path, hold_data_dir(path, host, port), created)
    except StartError:
        remove_created(path, created)
        raise


def remove_created(path: str, created: list[Path]) -> None:
    if not created:
        return
    lock_dir = Path(path) / ".gateway"
    with contextlib.suppress(OSError):
        (lock_dir / LOCK_NAME).unlink()
        lock_dir.rmdir()
    for directory in reversed(created):
        with contextlib.suppress(OSError):
            directory.rmdir()


def prepare_data_dir(path: str) -> list[Path]:
    """Creates the data directory (and its parents) if it is missing;
    StartError unless it is then a directory this user can write.  The
    directories it created, outermost first."""
    target = Path(path)
    created = [p for p in [*reversed(target.parents), target] if not p.exists()]
    if not target.is_dir():
        try:
            target.mkdir(parents=True, mode=0o700)  # the storage's own mode (FORMAT.md, Modes)
        except FileExistsError:
            raise StartError(f"data directory {path} is a file, not a directory: choose "
                             f"another ({WHERE_TO_CHOOSE})") from None
        except NotADirectoryError:
            blocker = next((p for p in target.parents if p.exists() and not p.is_dir()), target)
            raise StartError(f"data directory {path} cannot be created: {blocker} is a file, "
                             f"not a directory; choose another ({WHERE_TO_CHOOSE})") from None
        except PermissionError:
            raise StartError(f"data directory {path} cannot be created: user {_user()} may not "
                             f"write in {_existing_parent(target)}; create it for this user "
                             f"(sudo install -d -o {_user()} {path}) or choose another "
                             f"({WHERE_TO_CHOOSE})") from None
        except OSError as exc:
            raise StartError(f"data directory {path} cannot be created: "
                             f"{exc.strerror or exc}") from None
    check_writable(path)
    return created


SHARED_FILES = (".slots", ".usage", ".gateway")
"""What every worker opens for writing at its start, in the data directory."""


def check_writable(path: str) -> None:
    if os.access(path, os.W_OK | os.X_OK):
        for name in SHARED_FILES:
            shared = Path(path) / name
            if shared.exists() and not os.access(shared, os.W_OK | (os.X_OK if shared.is_dir() else 0)):
                raise StartError(f"{shared} in the data directory is not writable by user "
                                 f"{_user()} (it belongs to {_user(shared.stat().st_uid)}): every process "
                                 f"that opens a data directory runs as one user; give it to this "
                                 f"one (sudo chown -R {_user()} {path})")
        return
    if os.statvfs(path).f_flag & os.ST_RDONLY:
        raise StartError(f"data directory {path} is on a read-only filesystem: mount it "
                         f"read-write, or choose another ({WHERE_TO_CHOOSE})")
    raise StartError(f"data directory {path} is not writable by user {_user()}: give it to "
                     f"this user (sudo chown -R {_user()} {path}) or choose another "
                     f"({WHERE_TO_CHOOSE})")


def hold_data_dir(path: str, host: str, port: int) -> int:
    """Takes the data directory's gateway lock; its descriptor (the lock lasts
    while this process or a child that inherited it runs).  StartError if
    another gateway holds it, naming its PID."""
    lock_dir = Path(path) / ".gateway"
    lock_path = lock_dir / LOCK_NAME
    try:
        lock_dir.mkdir(mode=0o700, exist_ok=True)
        # Only this user may open it: anyone who can open it could flock it, and so keep
        # every gateway off the directory.
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise StartError(f"data directory {path}: cannot open {lock_path}: "
                         f"{exc.strerror or exc}; it must belong to user {_user()}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 4096, 0)
        os.close(fd)
        raise StartError(in_use(path, holder, lock_path)) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": host, "port": port,
                              "started": time.time()}).encode() + b"\n", 0)
    return fd


def in_use(path: str, holder: bytes, lock_path: Path) -> str:
    """The message for a data directory another gateway serves."""
    try:
        about: dict[str, Any] = json.loads(holder)
        pid = int(about["pid"])
    except (ValueError, KeyError, TypeError):
        return (f"data directory {path} is in use by another comet serve (fuser -v {lock_path} "
                "names it): one gateway per data directory; stop it first, or choose another "
                f"data directory ({WHERE_TO_CHOOSE})")
    since = datetime.fromtimestamp(float(about.get("started", 0)), timezone.utc)
    listening = f"listening on {about.get('host')}:{about.get('port')}, since {since:%Y-%m-%d %H:%M:%S} UTC"
    if not pid_alive(pid):
        return (f"data directory {path} is in use by the workers of a comet serve whose master "
                f"(PID {pid}, {listening}) has exited: they stop within 30 s, then start again "
                f"(fuser -v {lock_path} lists them)")
    return (f"data directory {path} is in use by comet serve PID {pid} ({listening}): one "
            f"gateway per data directory; stop that one first (kill -TERM {pid}), or choose "
            f"another data directory ({WHERE_TO_CHOOSE})")


def listen(addresses: list[Any], make_socket: Any) -> list[Any]:
    """The listening sockets of ``addresses`` (gunicorn's (host, port)
    tuples), each made by ``make_socket(address)`` (gunicorn's socket class
    binds and listens); StartError naming the address at the first that fails."""
    sockets: list[Any] = []
    try:
        for address in addresses:
            try:
                sockets.append(make_socket(address))
            except OSError as exc:
                raise StartError(cannot_listen(address, exc)) from None
    except BaseException:
        for s in sockets:
            s.close()
        raise
    return sockets


def cannot_listen(address: Any, exc: OSError) -> str:
    if not isinstance(address, tuple):
        return f"cannot listen on {address}: {exc.strerror or exc}"
    host, port = address[0], address[1]
    if exc.errno == errno.EADDRINUSE:
        return (f"port {port} on {host} is in use by another process: stop it (ss -ltnp "
                f"'sport = :{port}' names it), or choose another port (--port, COMET_PORT or "
                "port in the configuration file; make serve PORT=...)")
    if exc.errno == errno.EACCES:
        return (f"cannot listen on port {port}: ports below 1024 need root or "
                "CAP_NET_BIND_SERVICE; choose a port above 1023 (--port)")
    if exc.errno == errno.EADDRNOTAVAIL:
        return (f"cannot listen on {host}: it is no address of this machine; use one of its "
                "addresses, 127.0.0.1 or 0.0.0.0 (--host, COMET_HOST)")
    if isinstance(exc, socket.gaierror):
        return f"cannot listen on {host}: the name does not resolve ({exc.strerror or exc}) (--host)"
    return f"cannot listen on {host}:{port}: {exc.strerror or exc}"


def _user(uid: int | None = None) -> str:
    """A user's name (by default this process's), or the number without one."""
    uid = os.geteuid() if uid is None else uid
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _existing_parent(path: Path) -> Path:
    return next((p for p in path.parents if p.exists()), Path("/"))
