"""The handlers of the Starlette routes: reads, consumer groups, health,
metrics and this API's description, Starlette style (``async def
handler(request) -> Response``).  Each takes the worker's Runtime from the
app's state; gateway.routes says which path, method and scope each serves,
and gateway.answers.guarded answers what it raises.

Whatever reads every shard's state (stats: thousands of files with many
streams) or may touch the disk runs off the loop, whose heartbeat the master
kills a worker for missing.
"""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from . import admin, auth, entries, metrics, reads
from .errors import HTTPError
from .runtime import Runtime


def runtime_of(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


def name(request: Request) -> str:
    return str(request.path_params["name"])


def group(request: Request) -> str:
    return str(request.path_params["group"])


async def get_metrics(request: Request) -> Response:
    runtime = runtime_of(request)
    assert runtime.log is not None
    text = await run_in_threadpool(metrics.render, runtime.log, runtime.config.data_dir,
                                   runtime.layout, auth.readable(request.state.token, runtime.config))
    return Response(text, media_type="text/plain; version=0.0.4")


async def get_openapi(request: Request) -> Response:
    return reads.json(request.app.state.openapi)


async def get_health(request: Request) -> Response:
    return reads.healthz(runtime_of(request))


async def get_ready(request: Request) -> Response:
    runtime = runtime_of(request)
    if runtime.storage_full is not None:  # rechecking walks the directory: off the loop
        return await run_in_threadpool(reads.readyz, runtime)
    return reads.readyz(runtime)


async def get_streams(request: Request) -> Response:
    runtime = runtime_of(request)
    return await run_in_threadpool(reads.list_streams, runtime,
                                   auth.readable(request.state.token, runtime.config))


async def get_stream(request: Request) -> Response:
    return await run_in_threadpool(reads.describe_stream, runtime_of(request), name(request))


async def delete_stream(request: Request) -> Response:
    return reads.json(await run_in_threadpool(admin.remove_stream, runtime_of(request),
                                              name(request)))


async def get_entries(request: Request) -> Response:
    return reads.json(await run_in_threadpool(entries.read, runtime_of(request), name(request),
                                              request.query_params))


async def get_groups(request: Request) -> Response:
    return reads.json(await run_in_threadpool(admin.list_groups, runtime_of(request),
                                              name(request)))


async def get_group(request: Request) -> Response:
    return reads.json(await run_in_threadpool(admin.describe_group, runtime_of(request),
                                              name(request), group(request)))


async def put_group(request: Request) -> Response:
    body = bytearray()
    async for chunk in request.stream():  # a reset is a few bytes of JSON
        body += chunk
        if len(body) > admin.MAX_RESET_BYTES:
            raise HTTPError(413, "body_too_large", f"a group reset's body is at most "
                            f"{admin.MAX_RESET_BYTES} bytes")
    return reads.json(await run_in_threadpool(admin.reset, runtime_of(request), name(request),
                                              group(request), body))


async def delete_group(request: Request) -> Response:
    return reads.json(await run_in_threadpool(admin.remove_group, runtime_of(request),
                                              name(request), group(request)))
