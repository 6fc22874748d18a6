"""The OpenAPI 3.1 description of the gateway, served at /openapi.json.

Each route of gateway.routes.TABLE names its description here (a
``Describe``: what it answers, status by status, for one configuration), so
the document holds exactly the routes the app serves.  The descriptions are
written out by hand: they are the contract clients and the fuzzing test hold
the gateway to.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from starlette.routing import BaseRoute, Route

from .auth import Rule
from .config import GatewayConfig

Operation = dict[str, Any]

ERROR = {"$ref": "#/components/schemas/Error"}
STREAM_NAME = {"name": "name", "in": "path", "required": True,
               "schema": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"},
               "description": "Stream name; anything else is refused with 400."}
GROUP_NAME = {"name": "group", "in": "path", "required": True,
              "schema": {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,47}$"},
              "description": "Consumer group name; anything else is refused with 400."}

FORBIDDEN = ("The bearer token is not accepted, or lacks the scope the route needs "
             "(x-comet-scope; the detail names the token, the scope and the stream).")


def operations(routes: Iterable[BaseRoute]) -> list[tuple[str, str]]:
    """The (path, method) pairs a router answers, HEAD aside (it is GET without a body)."""
    return [(route.path, method) for route in routes if isinstance(route, Route)
            for method in sorted(route.methods or ()) if method != "HEAD"]


def _error(description: str, retry: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"description": description,
                           "content": {"application/json": {"schema": ERROR}}}
    if retry:
        out["headers"] = {"Retry-After": {"schema": {"type": "integer"},
                                          "description": "Seconds to wait before retrying."}}
    return out


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


class Context:
    """What every operation's description shares, for one configuration."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.security: list[dict[str, list[str]]] = [{"bearer": []}] if config.auth_required else []
        self.auth = {"401": _error("No bearer token (when tokens are required)."),
                     "403": _error(FORBIDDEN)}
        self.admin = {**self.auth, "403": _error(
            f"{FORBIDDEN[:-1]}, or the change needs admin = true (error admin_disabled).")}
        self.busy = {"503": _error("The worker is starting or draining.", retry=True)}

    def stream_read(self, summary: str, answer: str, *, extra: Iterable[dict[str, Any]] = (),
                    not_found: str = "Unknown stream.") -> Operation:
        return {"summary": summary, "security": self.security,
                "parameters": [STREAM_NAME, *extra],
                "responses": {"200": _json({"type": "object"}, answer),
                              "400": _error("Bad stream name or parameter."), **self.auth,
                              "404": _error(not_found), **self.busy}}

    def stream_change(self, summary: str, answer: str, *, extra: Iterable[dict[str, Any]] = (),
                      not_found: str = "Unknown stream.", body: Operation | None = None) -> Operation:
        out = {"summary": summary, "description": "Refused with 403 unless admin = true.",
               "security": self.security, "parameters": [STREAM_NAME, *extra],
               "responses": {"200": _json({"type": "object"}, answer),
                             "400": _error("Bad stream or group name, or a bad body."),
                             **self.admin, "404": _error(not_found), **self.busy}}
        if body is not None:
            out["requestBody"] = body
        return out


Describe = Callable[[Context], Operation]
"""A route's description, for the Context of one configuration."""


def stream_read(summary: str, answer: str, *, extra: Iterable[dict[str, Any]] = (),
                not_found: str = "Unknown stream.") -> Describe:
    return lambda c: c.stream_read(summary, answer, extra=extra, not_found=not_found)


def stream_change(summary: str, answer: str, *, extra: Iterable[dict[str, Any]] = (),
                  not_found: str = "Unknown stream.", body: Operation | None = None) -> Describe:
    return lambda c: c.stream_change(summary, answer, extra=extra, not_found=not_found, body=body)


def ingest(c: Context) -> Operation:
    return {
        "summary": "Append events to a stream",
        "description": "One request is one atomic batch in one shard: every event is stored, "
                       "contiguous and in order, or none is.",
        "security": c.security,
        "parameters": [
            STREAM_NAME,
            {"name": "key", "in": "query", "required": False, "schema": {"type": "string"},
             "description": "Partition key: events of one key go to one shard, in order."},
            {"name": "X-Comet-Key", "in": "header", "required": False, "schema": {"type": "string"},
             "description": "Partition key (same as ?key=)."},
            {"name": "Content-Encoding", "in": "header", "required": False,
             "schema": {"type": "string", "enum": ["identity", "gzip", "deflate", "zstd"]}},
        ],
        "requestBody": {"required": True, "content": {
            "application/json": {"schema": {"anyOf": [{"not": {"type": "array"}},
                                                      {"type": "array", "minItems": 1}]},
                                 "description": "One JSON value (one event), or a non-empty array "
                                                "(one event per element)."},
            "application/x-ndjson": {"schema": {"type": "string"},
                                     "description": "One JSON value per non-empty line."},
            "application/jsonl": {"schema": {"type": "string"}},
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"},
                                         "description": "One opaque event, not validated."},
        }},
        "responses": {
            "202": _json({"$ref": "#/components/schemas/Accepted"}, "Stored."),
            "400": _error("Bad stream name, empty body, or malformed JSON (with the index of the "
                          "first bad event); nothing of the request is stored."),
            **c.auth,
            "404": _error("Unknown stream while auto-create is off (or off for this name)."),
            "409": _error("Creating the stream would pass max_streams, or the token's share of them."),
            "413": _error("Body, decompressed body or one event above its limit."),
            "415": _error("Unsupported Content-Type or Content-Encoding."),
            "429": _error("The worker's in-flight byte budget, or the token's share of it, is spent.", retry=True),
            "503": _error("The worker is starting or draining, or the stream is being deleted.",
                          retry=True),
            "507": _error("Storage full: retention cannot free space.", retry=True),
        },
    }


STATUS = {"$ref": "#/components/schemas/Status"}


def _status(description: str, retry: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"description": description, "content": {
        "application/json": {"schema": STATUS},
        "application/x-protobuf": {"schema": {"type": "string", "format": "binary"},
                                   "description": "A google.rpc.Status message."}}}
    if retry:
        out["headers"] = {"Retry-After": {"schema": {"type": "integer"},
                                          "description": "Seconds to wait before retrying."}}
    return out


def otlp(signal: str, request: str, records: str) -> Describe:
    def build(c: Context) -> Operation:
        stream = c.config.otlp_stream(signal)
        return {
            "summary": f"OTLP/HTTP export of {records}",
            "description": f"Each of the request's {records} becomes one JSON event in stream "
                           f"{stream!r} (docs/opentelemetry.md); the request is one atomic batch "
                           "in the shard of its first resource's service.name. Answers and errors "
                           "come in the request's encoding.",
            "security": c.security,
            "parameters": [{"name": "Content-Encoding", "in": "header", "required": False,
                            "schema": {"type": "string", "enum": ["identity", "gzip", "deflate", "zstd"]}}],
            "requestBody": {"required": True, "content": {
                "application/x-protobuf": {"schema": {"type": "string", "format": "binary"},
                                           "description": f"An {request} message."},
                "application/json": {"schema": {"type": "object"},
                                     "description": f"An {request} in OTLP's JSON encoding."}}},
            "responses": {
                "200": {"description": "Stored; partial_success counts the records refused "
                                       "(ids of a wrong length, an event above max_entry_bytes).",
                        "content": {"application/json": {"schema": {"type": "object"}},
                                    "application/x-protobuf": {"schema": {
                                        "type": "string", "format": "binary"}}}},
                "400": _status("Not an OTLP request of this signal; nothing is stored."),
                "401": _status("No bearer token (when tokens are required)."),
                "403": _status(FORBIDDEN),
                "404": _status("The stream does not exist while auto-create is off."),
                "409": _status("Creating the stream would pass max_streams, or the token's share of them."),
                "413": _status("Body, decompressed body or the request's events above their "
                               "limit."),
                "415": _status("Unsupported Content-Type or Content-Encoding."),
                "429": _status("The worker's in-flight byte budget, or the token's share of it, is spent.", retry=True),
                "503": _status("The worker is starting or draining, or storage is full.",
                               retry=True),
            },
        }
    return build


def entries(c: Context) -> Operation:
    limit = {"type": "integer", "minimum": 1, "maximum": c.config.max_entries_per_read}
    return c.stream_read(
        "Read entries, a page at a time",
        "Entries (each with shard, entry, id, timestamp and value), skipped, and next: "
        "a cursor for the next page of the whole stream, or the next entry of the one shard.",
        extra=[{"name": "cursor", "in": "query", "schema": {"type": "string"},
                "description": "The next of the previous page: read the whole stream on from "
                               "there. Without cursor and shard: from the stream's start."},
               {"name": "shard", "in": "query", "schema": {"type": "integer", "minimum": 0},
                "description": "Read this shard only, in entry order."},
               {"name": "from", "in": "query", "schema": {"type": "integer", "minimum": 0},
                "description": "With shard: the first entry to read."},
               {"name": "limit", "in": "query", "schema": limit}])


RESET_BODY = {"required": True, "content": {"application/json": {"schema": {
    "type": "object",
    "description": 'Exactly one of "to", "to_entry" or "to_time"; "shard" limits it to one shard.',
    "properties": {"to": {"type": "string", "enum": ["earliest", "latest"]},
                   "to_entry": {"type": "integer", "minimum": 0},
                   "to_time": {"type": ["string", "number"],
                               "description": "ISO 8601 or unix seconds."},
                   "shard": {"type": "integer", "minimum": 0}}}}}}


def simple(summary: str, answer: str, *, open_: bool = False,
           media: str = "application/json") -> Describe:
    def build(c: Context) -> Operation:
        ok = {"description": answer, "content": {media: {"schema": (
            {"type": "object"} if media == "application/json" else {"type": "string"})}}}
        if open_:
            return {"summary": summary, "responses": {"200": ok}}
        return {"summary": summary, "security": c.security, "responses": {"200": ok, **c.auth}}
    return build


def readiness(c: Context) -> Operation:
    return {"summary": "Readiness: slot claimed, storage writable",
            "responses": {"200": _json({"type": "object"}, "Ready."),
                          "503": _json({"type": "object"}, "Not ready, with why.")}}


def document(config: GatewayConfig,
             routes: Iterable[tuple[str, str, Describe, Rule]]) -> dict[str, Any]:
    """The document of ``routes``: (path, method, description, scope) each."""
    context = Context(config)
    paths: dict[str, dict[str, Operation]] = {}
    for path, method, describe, scope in routes:
        operation = describe(context)
        operation["x-comet-scope"] = scope.describe()
        paths.setdefault(path, {})[method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "Comet ingest gateway", "version": "1"},
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {"type": "object", "required": ["error", "detail"],
                          "properties": {"error": {"type": "string"}, "detail": {"type": "string"},
                                         "index": {"type": "integer"}}},
                "Status": {"type": "object", "description": "google.rpc.Status",
                           "properties": {"code": {"type": "integer"}, "message": {"type": "string"},
                                          "details": {"type": "array"}}},
                "Accepted": {"type": "object", "required": ["stream", "shard", "first", "last", "count"],
                             "properties": {"stream": {"type": "string"}, "shard": {"type": "integer"},
                                            "first": {"type": "integer"}, "last": {"type": "integer"},
                                            "count": {"type": "integer"}}},
            },
        },
    }
