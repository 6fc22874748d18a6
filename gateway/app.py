"""The gateway's ASGI application, built from the route table (gateway.routes).

    app = create_app(gateway.config.load())

The ingest paths - nearly every request - go straight to their plain ASGI
applications (gateway.answers.PlainRoute): the one whose path ends in its
parameter (POST /streams/{name}) by prefix, the others (the OTLP paths) by
their exact path.  Everything else (reads, health, metrics, OpenAPI, the
lifespan) is a small Starlette app whose router holds every route of the
table, the ingest paths included, so that the routes, their 405s and the
OpenAPI document all come from one table.  The worker's state lives in one
``Runtime`` on ``app.state``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager, suppress
from typing import AsyncIterator
from urllib.parse import unquote

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from storage_c import CometError, check_group_name

from . import logs, losses, stalls
from .answers import PlainRoute, Timed, guarded
from .config import GatewayConfig
from .errors import HTTPError, check_name, clipped, storage_error
from .ingest import PREFIX
from .routes import LAYOUT, PATHS, document
from .runtime import Runtime
from .writes import Writer

log = logging.getLogger("comet.gateway.app")


class GatewayApp:
    """One worker's ASGI application: the ingest paths to their plain
    applications, the rest to Starlette."""

    def __init__(self, app: Starlette, writer: Writer, plain: dict[tuple[str, str], PlainRoute]) -> None:
        self.app = app
        self.writer = writer
        self.runtime = writer.runtime
        self.state = app.state
        self.router = app.router
        self.timed = Timed(self.routed, self.runtime)
        # the plain route whose last segment is its parameter, matched by prefix
        [(self.prefixed_method, self.prefix, self.prefixed)] = [
            (method, path[:path.index("{")], route) for (path, method), route in plain.items()
            if "{" in path]
        self.exact: dict[str, dict[str, PlainRoute]] = {}
        for (path, method), route in plain.items():
            if "{" not in path:
                self.exact.setdefault(path, {})[method] = route

    def claim_slot(self) -> None:
        """Claims this worker's process slot (gunicorn's post_worker_init)."""
        self.runtime.claim_slot()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            method, path, prefix = scope["method"], scope["path"], self.prefix
            if method == self.prefixed_method and path.startswith(prefix) and "/" not in path[len(prefix):]:
                await self.prefixed(scope, receive, send)
                return
            by_method = self.exact.get(path)
            if by_method is not None and method in by_method:
                await by_method[method](scope, receive, send)
            else:
                await self.timed(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def routed(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The Starlette app, or the answer to a path with an encoded "/"."""
        raw = scope.get("raw_path") or b""
        if b"%2" in raw and (b"%2f" in raw or b"%2F" in raw):
            await encoded_slash(raw).response()(scope, receive, send)
        else:
            await self.app(scope, receive, send)


def encoded_slash(raw_path: bytes) -> HTTPError:
    """The answer to a path with an encoded "/" (%2F) in a segment, which no
    route matches (the router sees the decoded path, where it would be a
    segment boundary): a stream's or a group's name with it is 400, any other
    path 404."""
    segments = [unquote(s) for s in raw_path.decode("latin-1").split("/")]
    if len(segments) > 2 and segments[1] == "streams":
        try:
            check_name(segments[2])
            if len(segments) > 4 and segments[3] == "groups":
                check_group_name(segments[4])
        except HTTPError as bad_stream:
            return bad_stream
        except CometError as bad_group:
            return storage_error(bad_group, 0)
    return HTTPError(404, "not_found", f"no route for {clipped(unquote(raw_path.decode('latin-1')))}")


class ByMethod:
    """The handlers of one path by HTTP method; HEAD is answered as GET.  The
    route holding it answers 405, with Allow, for any other method."""

    def __init__(self, handlers: dict[str, ASGIApp]) -> None:
        self.handlers = handlers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope["method"]
        await self.handlers[method if method in self.handlers else "GET"](scope, receive, send)


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    runtime: Runtime = app.state.runtime
    runtime.claim_slot()  # already under way when gunicorn's post_worker_init ran
    deadline = time.monotonic() + runtime.config.slot_wait_s
    while runtime.metrics is None and not runtime.stopping and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    # The first hop to a thread imports anyio's asyncio backend (20-25 ms here): made
    # now, before this worker listens, it is not paid by its first requests.
    await run_in_threadpool(lambda: None)
    watchers = [asyncio.create_task(stalls.watch_loop(runtime)),
                asyncio.create_task(losses.watch_losses(runtime))]
    yield
    for watch in watchers:  # before the metrics file is unmapped and the log closed
        watch.cancel()
        with suppress(asyncio.CancelledError):
            await watch
    await run_in_threadpool(runtime.drain_and_close)
    access: logs.AccessLog | None = app.state.access_log
    if access is not None:
        access.flush()


async def not_found(request: Request, exc: Exception) -> Response:
    path = request.url.path
    raw = request.scope.get("raw_path") or b""
    if path.startswith(PREFIX) and b"/" not in raw[len(PREFIX):]:
        try:  # one segment as sent, so a name with an encoded "/": say what is wrong with it
            check_name(path[len(PREFIX):])
        except HTTPError as bad:
            return bad.response()
    return HTTPError(404, "not_found", f"no route for {request.method} {path}").response()


async def bad_method(request: Request, exc: Exception) -> Response:
    headers = (exc.headers if isinstance(exc, HTTPException) else None) or {}
    allowed = ", ".join(sorted(m.strip() for m in headers.get("Allow", "").split(",") if m.strip()))
    return HTTPError(405, "method_not_allowed",
                     f"{request.method} is not allowed on {request.url.path}; use {allowed}",
                     headers={"Allow": allowed}).response()


def create_app(config: GatewayConfig) -> GatewayApp:
    runtime = Runtime(config, LAYOUT)
    access = logs.AccessLog() if config.access_log else None
    writer = Writer(runtime)
    plain: dict[tuple[str, str], PlainRoute] = {}
    routes = []
    for path, operations in PATHS.items():
        handlers: dict[str, ASGIApp] = {}
        for method, operation in operations.items():
            if operation.plain is not None:  # checks its scope itself, on its fast path
                route = operation.plain(writer, LAYOUT.series_of(path, method), access)
                handlers[method] = plain[(path, method)] = route
            elif operation.endpoint is not None:
                handlers[method] = guarded(operation.endpoint, operation.scope, log)
        routes.append(Route(path, ByMethod(handlers), methods=list(handlers)))
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={404: not_found, 405: bad_method})
    app.router.redirect_slashes = False  # "/streams/" is no route, not a redirect
    app.state.runtime = runtime
    app.state.access_log = access
    app.state.openapi = document(config)
    return GatewayApp(app, writer, plain)
