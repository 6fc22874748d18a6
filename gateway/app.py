"""The gateway's ASGI application: routes, the worker's lifespan, errors as JSON.

    app = create_app(gateway.config.load())

``POST /streams/{name}`` - nearly every request - goes straight to the plain
ASGI ``Ingest`` application; everything else (reads, health, metrics,
OpenAPI, the lifespan) is a small Starlette app whose router also lists that
POST, so that the routes, their 405s and the OpenAPI document all come from
one table.  The worker's state lives in one ``Runtime`` on ``app.state``.

Every request is counted in the duration histogram of /metrics once: the
ingest paths count their own (they know their status without a wrapper), and
``GatewayApp.timed`` counts every other request, 404s and 405s included, by
the route template Starlette matched.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager, suppress
from typing import AsyncIterator, Awaitable, Callable
from urllib.parse import unquote

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, request_response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from storage_c import CometError, check_group_name
from comet.jsonlog import event

from . import admin, auth, entries, logs, losses, metrics, openapi, reads, stalls
from .config import GatewayConfig
from .errors import HTTPError, check_name, clipped, storage_error
from .ingest import PREFIX, Ingest
from .otlp import SIGNALS as OTLP_PATHS
from .otlp import OtlpIngest
from .runtime import Runtime

log = logging.getLogger("comet.gateway.app")

Handler = Callable[[Request], Awaitable[Response]]


class GatewayApp:
    """One worker's ASGI application: POST /streams/{name} to the ingest
    path, the rest to Starlette."""

    def __init__(self, app: Starlette, ingest: Ingest, otlp: OtlpIngest) -> None:
        self.app = app
        self.ingest = ingest
        self.otlp = otlp
        self.runtime = ingest.runtime
        self.state = app.state
        self.router = app.router
        self.unmatched = {method: metrics.series_of(metrics.UNMATCHED, method)
                          for method in metrics.METHODS}

    def claim_slot(self) -> None:
        """Claims this worker's process slot (gunicorn's post_worker_init)."""
        self.ingest.runtime.claim_slot()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] == "http" and scope["method"] == "POST"
                and scope["path"].startswith(PREFIX) and "/" not in scope["path"][len(PREFIX):]):
            await self.ingest(scope, receive, send)
        elif scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in OTLP_PATHS:
            await self.otlp(scope, receive, send)
        elif scope["type"] == "http":
            await self.timed(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def timed(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The Starlette app, its answer counted by the route it matched."""
        t0 = time.perf_counter()
        status = 500  # what uvicorn answers if the app raises before it answers

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            raw = scope.get("raw_path") or b""
            if b"%2" in raw and (b"%2f" in raw or b"%2F" in raw):
                await encoded_slash(raw).response()(scope, receive, send_and_note)
            else:
                await self.app(scope, receive, send_and_note)
        finally:
            counts = self.runtime.metrics
            if counts is not None:
                route = scope.get("route")  # set by Starlette's router, a 405's too
                method = scope["method"]
                series = (metrics.series_of(route.path, method) if isinstance(route, Route)
                          else self.unmatched.get(method, self.unmatched["other"]))
                counts.request(series, status, time.perf_counter() - t0)


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


def create_app(config: GatewayConfig) -> GatewayApp:
    runtime = Runtime(config)
    access = logs.AccessLog() if config.access_log else None
    ingest = Ingest(runtime, access)
    otlp = OtlpIngest(ingest)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        runtime.claim_slot()  # already under way when gunicorn's post_worker_init ran
        deadline = time.monotonic() + config.slot_wait_s
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
        if access is not None:
            access.flush()

    def guarded(handler: Handler, rule: auth.Rule) -> ASGIApp:
        async def endpoint(request: Request) -> Response:
            try:
                token = None
                if rule.scope != auth.OPEN:
                    given = request.headers.getlist("authorization")
                    token = auth.identify(given[0] if given else "", config, len(given))
                    auth.require(token, config, rule.scope, auth.stream_of(rule, request.path_params))
                request.state.token = token  # None: auth off, or an open route
                return await handler(request)
            except HTTPError as exc:
                runtime.answered(exc, request.scope)
                return exc.response()
            except Exception:  # a bug, not the client's fault: say so, keep serving
                event(log, "internal_error", logging.ERROR, exc_info=True,
                      method=request.method, path=request.url.path)
                return HTTPError(500, "internal", "unexpected error; see the gateway's log").response()
        return request_response(endpoint)

    def name(request: Request) -> str:
        return str(request.path_params["name"])

    async def get_metrics(request: Request) -> Response:
        assert runtime.log is not None
        text = await run_in_threadpool(metrics.render, runtime.log, config.data_dir,
                                       auth.readable(request.state.token, config))
        return Response(text, media_type="text/plain; version=0.0.4")

    async def get_openapi(request: Request) -> Response:
        return reads.json(document)

    async def get_health(request: Request) -> Response:
        return reads.healthz(runtime)

    async def get_ready(request: Request) -> Response:
        if runtime.storage_full is not None:  # rechecking walks the directory: off the loop
            return await run_in_threadpool(reads.readyz, runtime)
        return reads.readyz(runtime)

    # Stats read every shard's state (thousands of files with many streams):
    # off the loop, whose heartbeat the master kills a worker for missing.
    async def get_streams(request: Request) -> Response:
        return await run_in_threadpool(reads.list_streams, runtime,
                                       auth.readable(request.state.token, config))

    async def get_stream(request: Request) -> Response:
        return await run_in_threadpool(reads.describe_stream, runtime, name(request))

    async def delete_stream(request: Request) -> Response:
        return reads.json(await run_in_threadpool(admin.remove_stream, runtime, name(request)))

    async def get_entries(request: Request) -> Response:
        return reads.json(await run_in_threadpool(entries.read, runtime, name(request),
                                                  request.query_params))

    async def get_groups(request: Request) -> Response:
        return reads.json(await run_in_threadpool(admin.list_groups, runtime, name(request)))

    async def get_group(request: Request) -> Response:
        return reads.json(await run_in_threadpool(admin.describe_group, runtime, name(request),
                                                  request.path_params["group"]))

    async def put_group(request: Request) -> Response:
        body = bytearray()
        async for chunk in request.stream():  # a reset is a few bytes of JSON
            body += chunk
            if len(body) > admin.MAX_RESET_BYTES:
                raise HTTPError(413, "body_too_large", f"a group reset's body is at most "
                                f"{admin.MAX_RESET_BYTES} bytes")
        return reads.json(await run_in_threadpool(admin.reset, runtime, name(request),
                                                  request.path_params["group"], body))

    async def delete_group(request: Request) -> Response:
        return reads.json(await run_in_threadpool(admin.remove_group, runtime, name(request),
                                                  request.path_params["group"]))

    # A path parameter never holds a "/": a path with more segments than a
    # route's is no route (404), one of a route's paths with another method 405.
    table: dict[str, dict[str, Handler | Ingest | OtlpIngest]] = {
        "/streams/{name}": {"POST": ingest, "GET": get_stream, "DELETE": delete_stream},
        "/streams/{name}/entries": {"GET": get_entries},
        "/streams/{name}/groups": {"GET": get_groups},
        "/streams/{name}/groups/{group}": {"GET": get_group, "PUT": put_group,
                                           "DELETE": delete_group},
        "/streams": {"GET": get_streams},
        "/v1/logs": {"POST": otlp},
        "/v1/traces": {"POST": otlp},
        "/v1/metrics": {"POST": otlp},
        "/healthz": {"GET": get_health},
        "/readyz": {"GET": get_ready},
        "/metrics": {"GET": get_metrics},
        "/openapi.json": {"GET": get_openapi},
    }

    def endpoint(path: str, method: str, handler: Handler | Ingest | OtlpIngest) -> ASGIApp:
        rule = auth.rule(path, method)  # every route says which scope it needs
        if isinstance(handler, (Ingest, OtlpIngest)):
            return handler  # the ingest paths check their rule themselves, on their fast path
        return guarded(handler, rule)

    unknown = [path for path in table if path not in metrics.ROUTE_INDEX]
    if unknown:  # the histogram of /metrics has a fixed set of routes
        raise LookupError(f"{', '.join(unknown)} routed but not in gateway.metrics.ROUTES")
    routes = [Route(path, ByMethod({method: endpoint(path, method, handler)
                                    for method, handler in handlers.items()}),
                    methods=list(handlers))
              for path, handlers in table.items()]
    document = openapi.document(config, openapi.operations(routes))

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

    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={404: not_found, 405: bad_method})
    app.router.redirect_slashes = False  # "/streams/" is no route, not a redirect
    app.state.runtime = runtime
    return GatewayApp(app, ingest, otlp)

