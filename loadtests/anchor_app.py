"""The gateway benchmark's anchor: the least an ingest endpoint can do on the
gateway's own stack (gunicorn + uvicorn_worker + Starlette).  ``POST
/streams/{name}`` reads the body and answers 202 with a JSON object shaped
like the gateway's; ``GET /readyz`` answers with the worker's pid (for
``tests/support/server.py``'s readiness wait).  Nothing is parsed or stored."""

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


app = Starlette(routes=[Route("/streams/{name:path}", post_stream, methods=["POST"]),
                        Route("/readyz", readyz, methods=["GET"])])
