"""The read side of the API: health, readiness and streams (their entries:
gateway/entries.py).  Everything here comes from the shared storage state, so
every worker answers the same."""

from __future__ import annotations

import errno
import os
from typing import Callable

import orjson
from starlette.responses import Response

from storage_c import CometError, StreamNotFound

from .errors import check_name, storage_error
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
    if not os.path.isdir(runtime.config.data_dir):
        problems.append(f"data directory {runtime.config.data_dir} is missing (removed while "
                        "the gateway ran?)")
    elif not os.access(runtime.config.data_dir, os.W_OK):
        problems.append(f"data directory {runtime.config.data_dir} is not writable")
    if runtime.storage_refused is not None:
        problems.append(f"storage refuses writes: {runtime.storage_refused}")
    if runtime.storage_full is not None and not runtime.room_returned():
        problems.append(f"storage full: {runtime.storage_full}")
    if problems:
        return json({"status": "not ready", "problems": problems, "slot": runtime.slot}, 503)
    return json({"status": "ready", "slot": runtime.slot,
                 "process_count": runtime.config.worker_count})


def list_streams(runtime: Runtime, readable: Callable[[str], bool]) -> Response:
    """The streams ``readable`` lets the caller see, with their sizes."""
    assert runtime.log is not None
    out = []
    for name in runtime.log.streams():
        if not readable(name):
            continue
        try:
            s = runtime.log.stats(name, oldest=False)
        except StreamNotFound:  # deleted since it was listed
            continue
        out.append({"name": name, "shards": len(s.shards), "entries": s.entries,
                    "disk_bytes": s.total("disk_bytes")})
    return json({"streams": out})


def describe_stream(runtime: Runtime, name: str) -> Response:
    check_name(name)
    assert runtime.log is not None
    try:
        s = runtime.log.stats(name)
    except CometError as exc:
        raise storage_error(exc, runtime.config.retry_after_s) from None
    return json({
        "name": name,
        "entries": s.entries,
        "disk_bytes": s.total("disk_bytes"),
        "oldest_timestamp": s.oldest_timestamp,
        "newest_timestamp": s.newest_timestamp,
        "shards": [{"shard": x.shard, "first": x.first_entry, "next": x.next_entry,
                    "durable": x.durable_entry, "segments": x.segments, "disk_bytes": x.disk_bytes,
                    "sync_failed": errno.errorcode.get(x.sync_failed_errno, str(x.sync_failed_errno))
                    if x.sync_failed_errno else None}
                   for x in s.shards],
        "groups": [{"name": g.name, "lag": g.lag, "shards": g.shards}
                   for g in s.group_lag().values()],
    })
