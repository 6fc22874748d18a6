"""The gateway application: routes, the worker's lifespan, errors as JSON.

    app = create_app(gateway.config.load())

``POST /streams/{name}`` - nearly every request - goes straight to the plain
ASGI ``Ingest`` application; everything else (reads, health, metrics,
OpenAPI, the lifespan) is a small Starlette app.  The worker's state lives in
one ``Runtime`` on ``app.state``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager
from typing import AsyncIterator, Awaitable, Callable

import orjson
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from . import admin, auth, logs, metrics, openapi, reads
from .config import GatewayConfig
from .errors import HTTPError, error_response, response_for
from .ingest import PREFIX, Ingest
from .runtime import Runtime

log = logging.getLogger("comet.gateway")

class Gateway:
    """Sends POST /streams/... to the ingest path, the rest to Starlette."""

    def __init__(self, app: Starlette, ingest: Ingest) -> None:
        self.app = app
        self.ingest = ingest
        self.state = app.state
        self.router = app.router

    def claim_slot(self) -> None:
        """Claims this worker's process slot (gunicorn's post_worker_init)."""
        self.ingest.runtime.claim_slot()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"].startswith(PREFIX):
            await self.ingest(scope, receive, send)
        else:
            await self.app(scope, receive, send)


def create_app(config: GatewayConfig) -> Gateway:
    runtime = Runtime(config)
    access = logs.AccessLog() if config.access_log else None

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        runtime.claim_slot()  # already under way when gunicorn's post_worker_init ran
        deadline = time.monotonic() + config.slot_wait_s
        while runtime.metrics is None and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        yield
        await run_in_threadpool(runtime.drain_and_close)
        if access is not None:
            access.flush()

    def guarded(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                auth.check(request, config)
                return await handler(request)
            except HTTPError as exc:
                return response_for(exc)
            except Exception:  # a bug, not the client's fault: say so, keep serving
                log.exception('{"event": "internal_error", "path": %s}', orjson.dumps(request.url.path).decode())
                return error_response(500, "internal", "unexpected error; see the gateway's log")
        return endpoint

    async def get_metrics(request: Request) -> Response:
        assert runtime.log is not None
        text = await run_in_threadpool(metrics.render, runtime.log, config.data_dir)
        return Response(text, media_type="text/plain; version=0.0.4")

    async def get_openapi(request: Request) -> Response:
        return reads.json(openapi.document(config))

    async def get_health(request: Request) -> Response:
        return reads.healthz(runtime)

    async def get_ready(request: Request) -> Response:
        if runtime.storage_full is not None:  # rechecking walks the directory: off the loop
            return await run_in_threadpool(reads.readyz, runtime)
        return reads.readyz(runtime)

    async def get_streams(request: Request) -> Response:
        return reads.list_streams(runtime)

    async def get_stream(request: Request) -> Response:
        return reads.describe_stream(runtime, request.path_params["name"])

    async def get_entries(request: Request) -> Response:
        return reads.peek(request, runtime, request.path_params["name"])

    async def get_groups(request: Request) -> Response:
        return reads.json(await run_in_threadpool(admin.list_groups, runtime,
                                                  request.path_params["name"]))

    async def put_group(request: Request) -> Response:
        body = await request.body()
        return reads.json(await run_in_threadpool(admin.reset, runtime, request.path_params["name"],
                                                  request.path_params["group"], body))

    async def delete_group(request: Request) -> Response:
        return reads.json(await run_in_threadpool(admin.remove_group, runtime,
                                                  request.path_params["name"],
                                                  request.path_params["group"]))

    async def delete_stream(request: Request) -> Response:
        return reads.json(await run_in_threadpool(admin.remove_stream, runtime,
                                                  request.path_params["name"]))

    # {name:path} takes slashes too, so that "a/b" or "..%2Fetc" reach the
    # name check (400) instead of missing every route (404).
    routes = [
        Route("/streams/{name:path}/entries", guarded(get_entries), methods=["GET"]),
        Route("/streams/{name:path}/groups", guarded(get_groups), methods=["GET"]),
        Route("/streams/{name:path}/groups/{group}", guarded(put_group), methods=["PUT"]),
        Route("/streams/{name:path}/groups/{group}", guarded(delete_group), methods=["DELETE"]),
        Route("/streams/{name:path}", guarded(get_stream), methods=["GET"]),
        Route("/streams/{name:path}", guarded(delete_stream), methods=["DELETE"]),
        Route("/streams", guarded(get_streams), methods=["GET"]),
        Route("/healthz", guarded(get_health), methods=["GET"]),
        Route("/readyz", guarded(get_ready), methods=["GET"]),
        Route("/metrics", guarded(get_metrics), methods=["GET"]),
        Route("/openapi.json", guarded(get_openapi), methods=["GET"]),
    ]
    async def not_found(request: Request, exc: Exception) -> Response:
        return error_response(404, "not_found", f"no route for {request.url.path}")

    async def bad_method(request: Request, exc: Exception) -> Response:
        return error_response(405, "method_not_allowed", f"{request.method} is not allowed here")

    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={404: not_found, 405: bad_method})
    app.state.runtime = runtime
    return Gateway(app, Ingest(runtime, access))
