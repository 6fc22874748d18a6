"""How every route answers: the one wrapper between a handler and its client.

A handler returns its answer or raises.  ``refusal`` turns what it raised
into the answer: an HTTPError as it is, counted and logged by
Runtime.answered (a token refused, a fault the operator must hear of); any
other exception is a bug, logged with its traceback as ``internal_error`` by
the route's logger and answered 500 ``internal``, and the worker keeps
serving.  Every request is then counted once in the duration histogram of
/metrics, by the route template it matched.

The wrapper comes in two shapes:

* ``PlainRoute``, the ingest paths (POST /streams/{name}, the OTLP paths):
  nearly every request, so a plain ASGI application that reads the raw
  header list once (``Head``) and writes the raw answer, without Starlette's
  request and response objects.  It checks the write scope, counts the
  answer's status, events and bytes with its duration, and writes the
  access log line.
* ``guarded``, every other route: a Starlette endpoint behind the scope
  check of its route; ``Timed`` counts its answer, and the 404s and 405s
  that reach no endpoint.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Awaitable, Callable
from urllib.parse import parse_qsl

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, request_response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from comet.jsonlog import event

from . import auth
from .bodies import ClientGone
from .errors import HTTPError
from .logs import AccessLog
from .metrics import METHODS, UNMATCHED
from .runtime import Runtime
from .tokens import WRITE, Token

Endpoint = Callable[[Request], Awaitable[Response]]

INTERNAL = "unexpected error; see the gateway's log"


def refusal(exc: Exception, runtime: Runtime, log: logging.Logger, scope: Scope,
            path: str) -> HTTPError:
    """The answer to what a handler raised (called in its ``except`` block:
    a bug's traceback is logged from there)."""
    if isinstance(exc, HTTPError):
        runtime.answered(exc, scope)
        return exc
    event(log, "internal_error", logging.ERROR, exc_info=True, method=scope["method"], path=path)
    return HTTPError(500, "internal", INTERNAL)


@dataclass
class Outcome:
    status: int = 500
    events: int = 0
    token: Token | None = None
    """The request's token (None: auth off, or no accepted token)."""


@dataclass
class Head:
    """What an ingest path needs from the request line and headers, read in
    one pass over the raw header list (Starlette's Headers would scan it once
    per lookup)."""

    stream: str
    content_type: str = ""
    encoding: str = "identity"
    length: int | None = None
    key: str | None = None
    authorization: str = ""
    authorizations: int = 0
    idempotency_key: str | None = None

    @classmethod
    def parse(cls, scope: Scope, stream: str) -> Head:
        """The head of a request to ``stream``."""
        head = cls(stream)
        for name, value in scope["headers"]:
            if name == b"content-type":
                head.content_type = value.split(b";", 1)[0].strip().lower().decode("latin-1")
            elif name == b"content-length":
                head.length = int(value) if value.isdigit() else None
            elif name == b"content-encoding":
                head.encoding = value.decode("latin-1")
            elif name == b"x-comet-key":
                head.key = value.decode("utf-8", "replace")
            elif name == b"authorization":
                head.authorization = value.decode("latin-1")
                head.authorizations += 1
            elif name == b"idempotency-key":
                head.idempotency_key = value.decode("latin-1")
        query = scope.get("query_string", b"")
        if b"key=" in query:
            for k, v in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
                if k == "key":
                    head.key = v
                    break
        return head


class PlainRoute:
    """An ingest path as a plain ASGI application: ``handle`` stores the
    request and returns its answer's body and extra headers, or raises."""

    OK = 200
    """The status of a stored request."""
    log: logging.Logger
    """Where a bug of this route is logged."""

    def __init__(self, runtime: Runtime, series: int, access_log: AccessLog | None) -> None:
        self.runtime = runtime
        self.series = series
        """Where this route's duration histogram starts (metrics.Layout.series_of)."""
        self.access_log = access_log

    def head_of(self, scope: Scope) -> Head:
        raise NotImplementedError

    async def handle(self, head: Head, receive: Receive,
                     outcome: Outcome) -> tuple[bytes, dict[str, str]]:
        raise NotImplementedError

    def content_type(self, head: Head) -> bytes:
        """The media type of the answer, a success's or an error's."""
        return b"application/json"

    def outward(self, exc: HTTPError) -> HTTPError:
        """The error as this route answers it."""
        return exc

    def error_body(self, error: HTTPError, content_type: bytes) -> bytes:
        return error.body()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        t0 = time.perf_counter()
        runtime = self.runtime
        head = self.head_of(scope)
        outcome = Outcome()
        try:
            outcome.token = auth.identify(head.authorization, runtime.config, head.authorizations)
            auth.require(outcome.token, runtime.config, WRITE, head.stream)
            body, headers = await self.handle(head, receive, outcome)
            outcome.status = self.OK
            content_type = self.content_type(head)
        except ClientGone:
            return
        except Exception as exc:
            error = refusal(self.outward(exc) if isinstance(exc, HTTPError) else exc, runtime,
                            self.log, scope, scope["path"])
            outcome.status, headers = error.status, error.headers
            content_type = self.content_type(head)
            body = self.error_body(error, content_type)
        raw_headers = [(b"content-type", content_type),
                       (b"content-length", str(len(body)).encode())]
        raw_headers += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        await send({"type": "http.response.start", "status": outcome.status, "headers": raw_headers})
        await send({"type": "http.response.body", "body": body})
        seconds = time.perf_counter() - t0
        metrics = runtime.metrics
        if metrics is not None:
            metrics.observe(self.series, outcome.status, seconds, outcome.events, head.length or 0)
        if self.access_log is not None:
            self.access_log.request(scope["path"], outcome.status, outcome.events, seconds,
                                    runtime.slot, outcome.token, scope.get("client"))


def guarded(endpoint: Endpoint, rule: auth.Rule, log: logging.Logger) -> ASGIApp:
    """``endpoint`` behind ``rule``'s scope check, its errors answered by ``refusal``.
    The request's token is ``request.state.token`` (None: auth off, or an open route)."""

    async def answer(request: Request) -> Response:
        runtime: Runtime = request.app.state.runtime
        try:
            token = None
            if rule.scope != auth.OPEN:
                config = runtime.config
                given = request.headers.getlist("authorization")
                token = auth.identify(given[0] if given else "", config, len(given))
                auth.require(token, config, rule.scope, auth.stream_of(rule, request.path_params))
            request.state.token = token
            return await endpoint(request)
        except Exception as exc:
            return refusal(exc, runtime, log, request.scope, request.url.path).response()

    return request_response(answer)


class Timed:
    """An ASGI application's answers in the duration histogram, by the route
    template Starlette's router matched (a 405's too), else as UNMATCHED."""

    def __init__(self, app: ASGIApp, runtime: Runtime) -> None:
        self.app = app
        self.runtime = runtime
        self.unmatched = {method: runtime.layout.series_of(UNMATCHED, method) for method in METHODS}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        t0 = time.perf_counter()
        status = 500  # what uvicorn answers if the app raises before it answers

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            counts = self.runtime.metrics
            if counts is not None:
                route = scope.get("route")  # set by Starlette's router, a 405's too
                method = scope["method"]
                series = (self.runtime.layout.series_of(route.path, method)
                          if isinstance(route, Route)
                          else self.unmatched.get(method, self.unmatched["other"]))
                counts.request(series, status, time.perf_counter() - t0)
