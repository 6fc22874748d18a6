"""The anchor of the gateway benchmark: the least an ingest endpoint can do on
the gateway's own stack (gunicorn + ``uvicorn_worker.UvicornWorker`` +
Starlette), so that the gateway's throughput can be read as a fraction of it.

``POST /streams/{name}`` reads the whole body and answers 202 with a small JSON
object (the same shape as the gateway's); ``GET /readyz`` answers 200 for the
benchmark's readiness wait.  Nothing is parsed, validated or stored.

Run it as the benchmark does (from the repository root)::

    .venv/bin/python -m gunicorn -k uvicorn_worker.UvicornWorker -w 2 \\
        -b 127.0.0.1:8099 --no-control-socket --keep-alive 5 \\
        --chdir loadtests anchor_app:app
"""

from __future__ import annotations

import os

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

ACCEPTED = b'{"stream":"bench","shard":0,"first":0,"last":0,"count":1}'


async def post_stream(request: Request) -> Response:
    await request.body()
    return Response(ACCEPTED, status_code=202, media_type="application/json")


async def readyz(request: Request) -> Response:
    return Response(b'{"status":"ready","pid":%d}' % os.getpid(), media_type="application/json")


app = Starlette(routes=[
    Route("/streams/{name:path}", post_stream, methods=["POST"]),
    Route("/readyz", readyz, methods=["GET"]),
])
