"""The OpenAPI 3.1 description of the gateway, served at /openapi.json.

Written out by hand rather than derived: it is the contract clients and the
fuzzing test hold the gateway to, route by route and status by status.
"""

from __future__ import annotations

from typing import Any

from .config import GatewayConfig

ERROR = {"$ref": "#/components/schemas/Error"}
STREAM_NAME = {"name": "name", "in": "path", "required": True,
               "schema": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"},
               "description": "Stream name; anything else is refused with 400."}


def _error(description: str, retry: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"description": description,
                           "content": {"application/json": {"schema": ERROR}}}
    if retry:
        out["headers"] = {"Retry-After": {"schema": {"type": "integer"},
                                          "description": "Seconds to wait before retrying."}}
    return out


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def document(config: GatewayConfig) -> dict[str, Any]:
    auth_errors = {"401": _error("No bearer token (when tokens are required)."),
                   "403": _error("The bearer token is not accepted.")}
    security: list[dict[str, list[str]]] = [{"bearer": []}] if config.auth_required else []
    ingest = {
        "summary": "Append events to a stream",
        "description": "One request is one atomic batch in one shard: every event is stored, "
                       "contiguous and in order, or none is.",
        "security": security,
        "parameters": [
            STREAM_NAME,
            {"name": "key", "in": "query", "required": False, "schema": {"type": "string"},
             "description": "Partition key: events of one key go to one shard, in order."},
            {"name": "X-Comet-Key", "in": "header", "required": False, "schema": {"type": "string"},
             "description": "Partition key (same as ?key=)."},
            {"name": "Content-Encoding", "in": "header", "required": False,
             "schema": {"type": "string", "enum": ["identity", "gzip", "zstd"]}},
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
            **auth_errors,
            "404": _error("Unknown stream while auto-create is off."),
            "413": _error("Body, decompressed body or one event above its limit."),
            "415": _error("Unsupported Content-Type or Content-Encoding."),
            "429": _error("The worker's in-flight byte budget is spent.", retry=True),
            "503": _error("The worker is starting or draining.", retry=True),
            "507": _error("Storage full: retention cannot free space.", retry=True),
        },
    }
    read_errors = {"400": _error("Bad stream name or parameter."), **auth_errors,
                   "404": _error("Unknown stream.")}
    return {
        "openapi": "3.1.0",
        "info": {"title": "Comet ingest gateway", "version": "1"},
        "paths": {
            "/streams/{name}": {
                "post": ingest,
                "get": {"summary": "Describe a stream", "security": security,
                        "parameters": [STREAM_NAME],
                        "responses": {"200": _json({"type": "object"}, "Shards, sizes, groups and lag."),
                                      **read_errors}},
            },
            "/streams/{name}/entries": {
                "get": {"summary": "Peek at entries (bounded)", "security": security,
                        "parameters": [
                            STREAM_NAME,
                            {"name": "shard", "in": "query", "schema": {"type": "integer", "minimum": 0}},
                            {"name": "from", "in": "query", "schema": {"type": "integer", "minimum": 0}},
                            {"name": "limit", "in": "query",
                             "schema": {"type": "integer", "minimum": 1,
                                        "maximum": config.max_entries_per_read}},
                        ],
                        "responses": {"200": _json({"type": "object"}, "Entries with ids, times and values."),
                                      **read_errors}},
            },
            "/streams": {"get": {"summary": "List streams", "security": security,
                                 "responses": {"200": _json({"type": "object"}, "Streams."),
                                               **auth_errors}}},
            "/healthz": {"get": {"summary": "Liveness",
                                 "responses": {"200": _json({"type": "object"}, "Alive.")}}},
            "/readyz": {"get": {"summary": "Readiness: slot claimed, storage writable",
                                "responses": {"200": _json({"type": "object"}, "Ready."),
                                              "503": _json({"type": "object"}, "Not ready, with why.")}}},
            "/metrics": {"get": {"summary": "Prometheus metrics of every worker", "security": security,
                                 "responses": {"200": {"description": "Text exposition format.",
                                                       "content": {"text/plain": {"schema": {"type": "string"}}}},
                                               **auth_errors}}},
            "/openapi.json": {"get": {"summary": "This document",
                                      "responses": {"200": _json({"type": "object"}, "OpenAPI 3.1.")}}},
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {"type": "object", "required": ["error", "detail"],
                          "properties": {"error": {"type": "string"}, "detail": {"type": "string"},
                                         "index": {"type": "integer"}}},
                "Accepted": {"type": "object", "required": ["stream", "shard", "first", "last", "count"],
                             "properties": {"stream": {"type": "string"}, "shard": {"type": "integer"},
                                            "first": {"type": "integer"}, "last": {"type": "integer"},
                                            "count": {"type": "integer"}}},
            },
        },
    }
