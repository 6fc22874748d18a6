"""The read side of the API: health, readiness, streams, and a bounded peek
at entries.  Everything here comes from the shared storage state, so every
worker answers the same."""

from __future__ import annotations

import os

import orjson
from starlette.requests import Request
from starlette.responses import Response

from storage_c import (
    CometError,
    ShardRangeError,
    StreamNameError,
    StreamNotFound,
    StreamStats,
    check_stream_name,
)
from storage_c.export import json_value

from .errors import HTTPError
from .runtime import Runtime


def json(body: object, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def healthz(runtime: Runtime) -> Response:
    return json({"status": "ok"})


def readyz(runtime: Runtime) -> Response:
    problems = []
    if runtime.draining:
        problems.append("draining")
    if runtime.slot is None:
        problems.append("no process slot yet")
    if not os.access(runtime.config.data_dir, os.W_OK):
        problems.append(f"data directory {runtime.config.data_dir} is not writable")
    if runtime.storage_full is not None and not runtime.room_returned():
        problems.append(f"storage full: {runtime.storage_full}")
    if problems:
        return json({"status": "not ready", "problems": problems, "slot": runtime.slot}, 503)
    return json({"status": "ready", "slot": runtime.slot,
                 "process_count": runtime.config.worker_count})


def _stream(runtime: Runtime, name: str) -> StreamStats:
    try:
        check_stream_name(name)
        assert runtime.log is not None
        return runtime.log.stats(name)
    except StreamNameError as exc:
        raise HTTPError(400, "invalid_stream_name", str(exc)) from None
    except StreamNotFound as exc:
        raise HTTPError(404, "unknown_stream", str(exc)) from None


def list_streams(runtime: Runtime) -> Response:
    assert runtime.log is not None
    out = []
    for name in runtime.log.streams():
        s = runtime.log.stats(name)
        out.append({"name": name, "shards": len(s.shards), "entries": s.entries,
                    "disk_bytes": s.total("disk_bytes")})
    return json({"streams": out})


def describe_stream(runtime: Runtime, name: str) -> Response:
    s = _stream(runtime, name)
    return json({
        "name": name,
        "entries": s.entries,
        "disk_bytes": s.total("disk_bytes"),
        "oldest_timestamp": s.oldest_timestamp,
        "newest_timestamp": s.newest_timestamp,
        "shards": [{"shard": x.shard, "first": x.first_entry, "next": x.next_entry,
                    "durable": x.durable_entry, "segments": x.segments, "disk_bytes": x.disk_bytes}
                   for x in s.shards],
        "groups": [{"name": g.name, "lag": g.lag, "shards": g.shards}
                   for g in s.group_lag().values()],
    })


def _int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise HTTPError(400, "bad_parameter", f"{name} must be an integer, not {raw!r}") from None
    if not low <= value <= high:
        raise HTTPError(400, "bad_parameter", f"{name} must be between {low} and {high}")
    return value


def peek(request: Request, runtime: Runtime, name: str) -> Response:
    s = _stream(runtime, name)
    limit_max = runtime.config.max_entries_per_read
    shard = _int_param(request, "shard", 0, 0, len(s.shards) - 1)
    start = _int_param(request, "from", s.shards[shard].first_entry, 0, 2**63 - 1)
    limit = _int_param(request, "limit", 100, 1, limit_max)
    assert runtime.log is not None
    try:
        batch = runtime.log.read(name, shard, start, limit, max_bytes=4 << 20)
    except ShardRangeError as exc:
        raise HTTPError(400, "bad_parameter", str(exc)) from None
    except CometError as exc:
        raise HTTPError(500, "storage_error", str(exc)) from None
    return json({
        "stream": name, "shard": shard, "next": batch.next_entry, "skipped": batch.skipped,
        "entries": [{"id": e.id, "entry": e.entry, "timestamp": e.timestamp, "value": json_value(e.payload)}
                    for e in batch],
    })
