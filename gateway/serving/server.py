"""The process of `comet serve`: a gunicorn master configured from one GatewayConfig.

gunicorn runs inside this process (the caller becomes the master: signals
reach it directly).  ``GatewayServer`` is a gunicorn application whose
settings and whose ASGI app both come from the GatewayConfig it holds; there
is no gunicorn configuration file and no app built at import time.  Workers
are forked from the master and build their app from that config in ``load``
(the app is never preloaded: storage is opened, and a process slot claimed,
in each worker).

Workers are uvicorn workers (gateway.serving.worker.CometWorker: lingering closes, a
graceful drain that answers every request it received); each claims a process
slot in post_worker_init (worker side, after its signal handlers are in
place), never in post_fork, where blocking would stall the master.  Shutdown
work lives in the ASGI lifespan, because gunicorn's worker_exit does not run
under the uvicorn worker.

HUP reloads: the configuration is read again from the same file and
environment and new workers start with it (TLS certificates included: each
worker builds its SSLContext from the files' contents the master read, see
gateway/tls.py), and one line says what it loaded (``reloaded``).  A file
that no longer loads is logged and the running configuration kept; stopping
the gateway on a typo would lose the service for no gain.  The settings a
running master cannot change (``RESTART_ONLY``: the data directory it
holds, its address, the number of slots) keep their running values, with a
warning naming them.

Before the master forks, ``run`` checks what it can (gateway.startup): the
data directory, that no other gateway serves it, the address; a failure is
one line (StartError).  Every stop signal (TERM, INT, QUIT) stops the same
way, draining (``CometArbiter``).
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import resource
import signal
import ssl
import stat
from typing import Any, Callable, cast

from gunicorn import systemd
from gunicorn.app.base import BaseApplication
from gunicorn.arbiter import Arbiter
from gunicorn.sock import BaseSocket, TCP6Socket, TCPSocket
from gunicorn.util import is_ipv6

from comet.jsonlog import capture_stray_output, dict_config, event

from .. import startup
from ..app import GatewayApp, create_app
from ..config import ConfigError, GatewayConfig, is_loopback
from ..tls import TlsMaterial

log = logging.getLogger("comet.gateway.server")

PR_SET_PDEATHSIG = 1
M_TRIM_THRESHOLD = -1       # glibc's mallopt parameters
HEAP_KEPT_BYTES = 64 << 20  # freed heap a worker keeps instead of giving it back to the kernel
WORKER_CLASS = "gateway.serving.worker.CometWorker"
# Every line as JSON on stdout: gunicorn's own logger (whose handlers uvicorn's
# worker copies to uvicorn's) included; the access log is ours (gateway.logs).
LOGGING = dict_config(own_handlers=("gunicorn.error",),
                      silenced=("gunicorn.access", "uvicorn.access"))


class GatewayServer(BaseApplication):
    """gunicorn, configured by ``load_config()`` (called now and on every HUP)."""

    def __init__(self, load_config: Callable[[], GatewayConfig]) -> None:
        self._read_config = load_config
        self.config = load_config()  # a bad configuration fails here, before any process starts
        self._config_is_fresh = True
        self._claim: startup.DataDirClaim | None = None
        super().__init__(prog="comet serve")

    def run(self) -> None:
        """gunicorn's master, in this process, once what it can check before
        forking is right (StartError otherwise, nothing started)."""
        startup.check_workers(self.config)
        claim = startup.claim_data_dir(self.config.data_dir, self.config.host, self.config.port)
        capture_stray_output()  # inherited by the workers, which are forked from here
        raise_file_limit()  # inherited too: each worker's open-shard budget derives from it
        arbiter = CometArbiter(self)  # sets up the logging
        try:
            # gunicorn binds only when it has no listeners yet (Arbiter.start)
            arbiter.LISTENERS = listening_sockets(arbiter)  # type: ignore[misc]  # per instance, as gunicorn sets it
        except startup.StartError:
            claim.abandon()
            raise
        self._claim = claim  # held (and inherited by every worker) until the process exits
        if claim.created:
            event(log, "data_directory_created", path=self.config.data_dir)
        arbiter.run()

    def load_config(self) -> None:
        if not self._config_is_fresh:  # a reload (HUP): read the configuration again
            try:
                self.config = reloaded(self.config, self._read_config())
            except ConfigError as exc:
                event(log, "reload_config_invalid", logging.ERROR, error=str(exc),
                      action="keeping the running configuration")
        self._config_is_fresh = False
        for name, value in gunicorn_settings(self.config).items():
            self.cfg.set(name, value)

    def load(self) -> GatewayApp:
        return create_app(self.config)


def listening_sockets(arbiter: Arbiter) -> list[BaseSocket]:
    """The master's listening sockets, bound once (StartError: one line); none
    under systemd's socket activation, whose sockets gunicorn takes itself."""
    if systemd.listen_fds(unset_environment=False):
        return []

    def bound(address: Any) -> BaseSocket:  # a (host, port) tuple, which the stubs miss
        kind = TCP6Socket if is_ipv6(address[0]) else TCPSocket
        return kind(address, arbiter.cfg, cast(Any, arbiter.log))

    return startup.listen(arbiter.cfg.address, bound)


class CometArbiter(Arbiter):
    """gunicorn's master, where INT (Ctrl-C) and QUIT stop as TERM does: the
    workers drain, sync and release their slots.  gunicorn's own INT and QUIT
    send the workers QUIT, which the uvicorn worker ignores until the graceful
    timeout's SIGKILL, 30 s later.  A second INT or QUIT while the workers
    drain still cuts the drain short (gunicorn's stop)."""

    def handle_int(self) -> None:
        self.handle_term()

    def handle_quit(self) -> None:
        self.handle_term()


RESTART_ONLY = ("data_dir", "host", "port", "workers")
"""Settings a HUP cannot change: the master holds the data directory and the
listening sockets, and every worker's slot is one of ``workers``."""


def reloaded(running: GatewayConfig, new: GatewayConfig) -> GatewayConfig:
    """The configuration a HUP read, but with the running values of
    RESTART_ONLY, logged: one line of what was loaded (``reloaded``), and a
    warning for restart-only settings that changed (``reload_needs_restart``)."""
    pinned = {name: getattr(running, name) for name in RESTART_ONLY
              if getattr(new, name) != getattr(running, name)}
    if pinned:
        event(log, "reload_needs_restart", logging.WARNING, settings=sorted(pinned),
              action="kept their running values; stop and start the gateway to change them")
        new = dataclasses.replace(new, **pinned)
    changed = sorted(f.name for f in dataclasses.fields(GatewayConfig)
                     if f.compare and getattr(new, f.name) != getattr(running, f.name))
    if new.tls != running.tls:
        changed.append("tls")
    event(log, "reloaded", changed=changed, tokens=len(new.access), **tls_summary(new.tls))
    return new


def tls_summary(tls: TlsMaterial | None) -> dict[str, Any]:
    """What a log line says of the listener's certificate: its serial and expiry."""
    if tls is None:
        return {"tls": False}
    about = tls.certificate()
    return {"tls": True, "tls_cert_serial": about.get("serialNumber"),
            "tls_cert_not_after": about.get("notAfter"),
            "tls_client_ca": tls.client_ca is not None}


NOFILE_WHEN_UNLIMITED = 1 << 20  # the kernel refuses an unlimited RLIMIT_NOFILE


def raise_file_limit() -> int:
    """Raises this process's soft RLIMIT_NOFILE to its hard limit and returns
    it.  Each worker keeps at most max_open_shards shards open, derived from
    this limit when not set (storage_c.Config.max_open_shards), and sockets
    count against it too; a soft limit of 1,024 (a common default) would cap
    a worker at 224 shards however much the system allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = NOFILE_WHEN_UNLIMITED if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            return soft
        return want
    return soft


def gunicorn_settings(config: GatewayConfig) -> dict[str, Any]:
    return {
        "bind": [f"{config.host}:{config.port}"],
        **tls_settings(config.tls),
        # gunicorn's default trusts 127.0.0.1: a client on the machine could claim any address.
        "forwarded_allow_ips": ",".join(config.forwarded_allow_ips),
        "workers": config.worker_count,
        "worker_class": WORKER_CLASS,
        "control_socket_disable": True,  # parallel gunicorns must not share one control socket
        "graceful_timeout": 30,
        "timeout": 60,
        "keepalive": 5,
        "accesslog": None,  # ours is gateway.logs.AccessLog, written by the app
        "logconfig_dict": LOGGING,
        "proc_name": "comet-gateway",
        "post_worker_init": post_worker_init,
        "when_ready": lambda _arbiter: warn_at_start(config),  # once, at start, logging set up
    }


def warn_at_start(config: GatewayConfig) -> None:
    """One warning for each thing the operator set up in a way that exposes
    what the gateway guards."""
    if config.tls is None and not is_loopback(config.host):
        event(log, "plaintext_listener", logging.WARNING, host=config.host, port=config.port,
              risk="tokens and events cross the network in clear text",
              action="set tls_cert_file and tls_key_file, or bind to loopback behind a "
                     "TLS-terminating proxy")
    if config.tokens_unenforced:
        event(log, "tokens_not_enforced", logging.WARNING, auth=config.auth, host=config.host,
              tokens=len(config.tokens),
              risk="tokens are configured but not asked for: any client may read and write "
                   "every stream",
              action='set auth = "on" (COMET_AUTH=on) to require them')
    for setting in ("tls_key_file", "tokens_file"):
        path = str(getattr(config, setting))
        mode = file_mode(path) if path else None
        if mode is not None and mode & 0o004:
            event(log, "secret_readable_by_others", logging.WARNING, setting=setting, path=path,
                  mode=f"{mode:04o}", risk="every local user can read it",
                  action=f"chmod 600 {path} (or 640 with a group of the gateway's user)")


def file_mode(path: str) -> int | None:
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return None


def tls_settings(tls: TlsMaterial | None) -> dict[str, Any]:
    """gunicorn's TLS settings.  The file names tell gunicorn (and the uvicorn
    worker) that the listener speaks TLS; the context itself comes from the
    ``ssl_context`` hook, from the bytes the master read (gateway.serving.worker
    hands the hook to uvicorn)."""
    if tls is None:
        return {"certfile": None, "keyfile": None, "ca_certs": None, "cert_reqs": ssl.CERT_NONE}

    def ssl_context(_cfg: Any, _default: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
        return tls.context()

    return {"certfile": tls.cert_file, "keyfile": tls.key_file, "ca_certs": tls.client_ca_file or None,
            "cert_reqs": ssl.CERT_REQUIRED if tls.client_ca is not None else ssl.CERT_NONE,
            "ssl_context": ssl_context}


def post_worker_init(worker: Any) -> None:
    # The uvicorn worker never checks that its master is alive: a master
    # killed with SIGKILL would leave workers holding the port and the slots
    # forever.  Ask the kernel for a SIGTERM (a graceful stop) when it dies.
    if not set_parent_death_signal(signal.SIGTERM) or os.getppid() != worker.ppid:
        os.kill(os.getpid(), signal.SIGTERM)
    keep_freed_heap(HEAP_KEPT_BYTES)
    app: GatewayApp = worker.wsgi
    app.claim_slot()


def keep_freed_heap(limit: int) -> bool:
    """Raises glibc's trim threshold to ``limit`` bytes: request bodies of a
    few to a hundred KiB are allocated and freed at the top of the heap, and
    with the default (128 KiB, adjusted upwards only by large frees) a worker
    under NDJSON load shrank and regrew its heap with brk about once per seven
    requests, then faulted the same pages in again (~3 % of its CPU).  False
    where the C library has no mallopt (not glibc): nothing changes."""
    try:
        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(M_TRIM_THRESHOLD, int(limit)) == 1)
    except (OSError, AttributeError):
        return False


def set_parent_death_signal(sig: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False
