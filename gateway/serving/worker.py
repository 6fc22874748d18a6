"""The gunicorn worker of `comet serve`: uvicorn's worker, serving with
gateway.serving.protocol.CometHttpProtocol (lingering closes, a drain that answers
every request it received), and a server that closes its listening sockets
without resetting a connection already queued on them.

``CometServer`` marks the drain before it stops accepting (so connections
accepted late drain too), adopts the connections still queued on the
listening sockets, and on the final stop first refuses new handshakes (see
its docstring), so that closing the listener resets nobody.  A handshake
slower than ``CometServer.HANDSHAKE_S`` can still be reset (or, without
Linux's /proc and socket filters, one completing between the last accept()
and the close(), a few microseconds).

Every stop signal a worker may get stops it the same way: TERM (from its
master), INT (Ctrl-C reaches the whole process group) and QUIT (Ctrl-\\, or
the master's quick stop) start the drain; a second INT or QUIT cuts it
short.  A stopped worker exits with status 0, which its master logs as
nothing unusual (uvicorn re-raises the signal it caught, and gunicorn logs a
worker killed by INT or QUIT as a warning).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import sys
from types import FrameType
from typing import Any, Callable

from gunicorn.arbiter import Arbiter
from uvicorn.server import Server
from uvicorn_worker import UvicornWorker

from comet.jsonlog import event

from ..limits import Limits
from .listeners import master_holds, refuse_new_connections, take_queued
from .protocol import CometHttpProtocol
from ..tls import handshake_failures

log = logging.getLogger("comet.gateway.worker")


class CometServer(Server):
    """uvicorn's Server, whose shutdown marks the drain first, and closes the
    listening sockets without resetting a connection the kernel has already
    completed.

    On a reload the master keeps the listening socket open: what is queued
    there waits for the new workers.  On the final stop (the master has closed
    its copy) the last close of the socket resets every connection still in
    its accept queue, and a client there has already sent its request.  So the
    worker first stops new handshakes (a socket filter that drops SYNs: those
    clients' connects are later refused, nothing sent), lets the handshakes
    under way finish for HANDSHAKE_S while it keeps accepting, and then accepts
    what is queued and closes, back to back."""

    HANDSHAKE_S = 0.2
    FORCING = (signal.SIGINT, signal.SIGQUIT)

    def __init__(self, config: Any, on_stop: Callable[[], None] = lambda: None,
                 limits: Limits | None = None) -> None:
        super().__init__(config)
        self.on_stop = on_stop
        self.limits = limits or Limits()
        self.server_state.limits = self.limits  # type: ignore[attr-defined]  # ours, read by getattr

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit and sig in self.FORCING:
            self.force_exit = True
        self.should_exit = True
        self.on_stop()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's startup, whose listeners also bound the TLS handshake
        (header_timeout_s: asyncio's default keeps a silent TLS connection 60 s)."""
        if sockets is None:
            await super().startup(sockets)
            return
        await super().startup(sockets=[])  # the lifespan; no listener yet
        loop = asyncio.get_running_loop()
        tls = self.config.ssl
        for sock in sockets:
            self.servers.append(await loop.create_server(
                self._protocol, sock=sock, ssl=tls, backlog=self.config.backlog,
                ssl_handshake_timeout=self.limits.header_timeout_s if tls is not None else None))

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.server_state.draining = True  # type: ignore[attr-defined]  # ours, read by getattr
        listeners = list(sockets or [])
        if listeners and not any(master_holds(listener) for listener in listeners):
            if all([refuse_new_connections(listener) for listener in listeners]):
                event(log, "final_stop", listeners=len(listeners),
                      action="new connections are refused, queued ones are served")
                await asyncio.sleep(self.HANDSHAKE_S)
        queued = take_queued(listeners, self.servers)
        if queued:
            loop = asyncio.get_running_loop()
            results = await asyncio.gather(
                *(loop.connect_accepted_socket(self._protocol, conn, ssl=self.config.ssl) for conn in queued),
                return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException):
                    event(log, "queued_connection_lost", logging.WARNING, error=repr(result))
        await super().shutdown(sockets)  # closes the servers again (no-op), drains, lifespan shutdown

    def _protocol(self) -> asyncio.Protocol:
        return self.config.http_protocol_class(  # type: ignore[call-arg]  # typed as asyncio's
            config=self.config, server_state=self.server_state, app_state=self.lifespan.state)


class CometWorker(UvicornWorker):
    """gunicorn worker class of `comet serve` (gateway/serving/server.py)."""

    # proxy_headers off unless a proxy is trusted (forwarded_allow_ips): with
    # nobody to believe there is nothing to rewrite, and the rewriting cost
    # ~2.5 % of a single-event request.
    CONFIG_KWARGS: dict[str, Any] = {"loop": "auto", "http": CometHttpProtocol, "ws": "none",
                                     "proxy_headers": False}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.config.proxy_headers = bool(self.cfg.forwarded_allow_ips)
        if self.cfg.is_ssl:
            # uvicorn's worker passes gunicorn's TLS files but not its ssl_context
            # hook, which is where the gateway's context (TLS floor, client CA) is made.
            hook = self.cfg.ssl_context
            self.config.ssl_context_factory = lambda config, default: hook(self.cfg, default)
        # Cancel what still runs a little before gunicorn's SIGKILL, so that the
        # lifespan shutdown (sync, release the slot) always runs.
        self.config.timeout_graceful_shutdown = max(1, int(self.cfg.graceful_timeout) - 5)
        self.config.server_header = False  # which server and version: nothing a client needs

    async def _serve(self) -> None:
        self.config.app = self.wsgi
        runtime = self.wsgi.runtime  # gateway.app.GatewayApp
        handshake_failures.refusals = runtime.refusals
        server = CometServer(self.config, on_stop=runtime.stop_waiting,
                             limits=Limits.of(runtime.config, runtime.refusals))
        # uvicorn-worker's own QUIT handler only marks gunicorn's worker as
        # stopping, which the uvicorn server never looks at.  A plain handler,
        # as uvicorn's for INT and TERM: Python runs pending ones in signal
        # number order, so a QUIT to the process group (Ctrl-\) is seen before
        # the TERM its master sends on, and does not count as a second signal.
        signal.signal(signal.SIGQUIT, server.handle_exit)
        await server.serve(sockets=self.sockets)
        if not server.started:
            sys.exit(Arbiter.WORKER_BOOT_ERROR)
