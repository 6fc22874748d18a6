"""The gunicorn worker of `comet serve`: uvicorn's worker, serving with
gateway.protocol.CometHttpProtocol (lingering closes, a drain that answers
every request it received), and a server that closes its listening sockets
without resetting a connection already queued on them.

``CometServer`` marks the drain before it stops accepting (so connections
accepted late drain too), adopts the connections still queued on the
listening sockets, and on the final stop first refuses new handshakes (see
its docstring), so that closing the listener resets nobody.  A handshake
slower than ``CometServer.HANDSHAKE_S`` can still be reset (or, without
Linux's /proc and socket filters, one completing between the last accept()
and the close(), a few microseconds).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from typing import Any

from gunicorn.arbiter import Arbiter
from uvicorn.server import Server
from uvicorn_worker import UvicornWorker

from storage_c.jsonlog import event

from .limits import Limits
from .listeners import master_holds, refuse_new_connections, take_queued
from .protocol import CometHttpProtocol
from .tls import handshake_failures

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

    def __init__(self, config: Any, limits: Limits | None = None) -> None:
        super().__init__(config=config)
        self.limits = limits or Limits()
        self.server_state.limits = self.limits  # type: ignore[attr-defined]  # ours, read by getattr

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
    """gunicorn worker class of `comet serve` (gateway/server.py)."""

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
        server = CometServer(config=self.config, limits=Limits.of(runtime.config, runtime.refusals))
        self._install_sigquit_handler()
        await server.serve(sockets=self.sockets)
        if not server.started:
            sys.exit(Arbiter.WORKER_BOOT_ERROR)
