"""The gateway's routes, each declared once in ``TABLE``: its path, method,
the scope it needs, its handler and its OpenAPI description.

Everything else about the routes is derived from the table: the app's router
and its dispatch of the ingest paths (gateway.app), the scope of each route
(``SCOPES``; the docs' table of scopes is checked against it), the routes
of the duration histogram of /metrics (``LAYOUT``: one series per path, in
the table's order, which is the layout of the workers' metrics files), and
the OpenAPI document (``document``).

A handler is either a Starlette endpoint (gateway.endpoints) or, for the
ingest paths, a plain ASGI application (gateway.answers.PlainRoute) that the
app builds once per worker on the worker's Writer.  A path parameter never
holds a "/": a path with more segments than a route's is no route (404), one
of a route's paths with another method 405.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

from . import endpoints, metrics, openapi
from .answers import Endpoint, PlainRoute
from .auth import ANY, OPEN, OTLP, PATH, TOKEN, Rule
from .config import GatewayConfig
from .ingest import Ingest
from .logs import AccessLog
from .otlp import LOGS, METRICS, TRACES, OtlpIngest, Signal
from .tokens import ADMIN, READ, WRITE
from .writes import Writer

PlainFactory = Callable[[Writer, int, AccessLog | None], PlainRoute]
"""Builds a plain route from the worker's Writer, the route's series
(metrics.Layout.series_of) and the access log."""


@dataclass(frozen=True)
class Operation:
    """One method of one path."""

    path: str
    method: str
    scope: Rule
    describe: openapi.Describe
    endpoint: Endpoint | None = None
    plain: PlainFactory | None = None

    def __post_init__(self) -> None:
        if (self.endpoint is None) == (self.plain is None):
            raise TypeError(f"{self.method} {self.path}: give an endpoint or a plain route, "
                            "one of them")


def otlp(path: str, signal: Signal, records: str) -> Operation:
    """An OTLP/HTTP export path; ``records``: what its records are called in its description."""
    return Operation(path, "POST", Rule(WRITE, OTLP),
                     openapi.otlp(signal.name, signal.request.DESCRIPTOR.name, records),
                     plain=partial(OtlpIngest, signal))


TABLE: tuple[Operation, ...] = (
    Operation("/streams/{name}", "POST", Rule(WRITE, PATH), openapi.ingest, plain=Ingest),
    Operation("/streams/{name}", "GET", Rule(READ, PATH), openapi.stream_read(
        "Describe a stream", "Shards, sizes, groups and lag."), endpoints.get_stream),
    Operation("/streams/{name}", "DELETE", Rule(ADMIN), openapi.stream_change(
        "Delete a stream and free its disk", "The stream deleted."), endpoints.delete_stream),
    Operation("/streams/{name}/entries", "GET", Rule(READ, PATH), openapi.entries,
              endpoints.get_entries),
    Operation("/streams/{name}/groups", "GET", Rule(READ, PATH), openapi.stream_read(
        "List consumer groups", "Each group's lag, and its offset and lag in each shard."),
        endpoints.get_groups),
    Operation("/streams/{name}/groups/{group}", "GET", Rule(READ, PATH), openapi.stream_read(
        "Describe a consumer group", "The group's lag, and its offset and lag in each shard.",
        extra=[openapi.GROUP_NAME], not_found="Unknown stream, or the group is not registered."),
        endpoints.get_group),
    Operation("/streams/{name}/groups/{group}", "PUT", Rule(ADMIN), openapi.stream_change(
        "Move a consumer group", "The group's offsets before and after, per shard.",
        extra=[openapi.GROUP_NAME], not_found="Unknown stream, or the group is not registered.",
        body=openapi.RESET_BODY), endpoints.put_group),
    Operation("/streams/{name}/groups/{group}", "DELETE", Rule(ADMIN), openapi.stream_change(
        "Unregister a consumer group", "The shards it was deleted from.",
        extra=[openapi.GROUP_NAME], not_found="Unknown stream."), endpoints.delete_group),
    # lists only the streams the token may read
    Operation("/streams", "GET", Rule(READ, ANY), openapi.simple("List streams", "Streams."),
              endpoints.get_streams),
    otlp("/v1/logs", LOGS, "log records"),
    otlp("/v1/traces", TRACES, "spans"),
    otlp("/v1/metrics", METRICS, "metric data points"),
    Operation("/healthz", "GET", Rule(OPEN), openapi.simple("Liveness", "Alive.", open_=True),
              endpoints.get_health),
    Operation("/readyz", "GET", Rule(OPEN), openapi.readiness, endpoints.get_ready),
    # every stream's counters, by name: for a monitoring token with read scope
    Operation("/metrics", "GET", Rule(READ, ANY), openapi.simple(
        "Prometheus metrics of every worker", "Text exposition format.", media="text/plain"),
        endpoints.get_metrics),
    # the API's description: nothing of the data
    Operation("/openapi.json", "GET", Rule(TOKEN), openapi.simple("This document", "OpenAPI 3.1."),
              endpoints.get_openapi),
)



def by_path(table: tuple[Operation, ...]) -> dict[str, dict[str, Operation]]:
    """The table by path, then by method, in the table's order."""
    out: dict[str, dict[str, Operation]] = {}
    for operation in table:
        out.setdefault(operation.path, {})[operation.method] = operation
    return out


PATHS = by_path(TABLE)
SCOPES: dict[tuple[str, str], Rule] = {(op.path, op.method): op.scope for op in TABLE}
LAYOUT = metrics.Layout(tuple(PATHS))


def document(config: GatewayConfig) -> dict[str, Any]:
    """The OpenAPI document of every route, for ``config``."""
    return openapi.document(config, [(op.path, op.method, op.describe, op.scope)
                                     for methods in PATHS.values()
                                     for _, op in sorted(methods.items())])
