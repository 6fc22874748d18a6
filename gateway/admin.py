"""The life cycle of streams and consumer groups over HTTP.

    GET    /streams/{name}/groups            groups with offset and lag per shard
    GET    /streams/{name}/groups/{group}    one group, the same
    PUT    /streams/{name}/groups/{group}    reset: {"to": "earliest" | "latest"},
                                             {"to_entry": N} or {"to_time": T}, "shard" optional
    DELETE /streams/{name}/groups/{group}    unregister the group
    DELETE /streams/{name}                   delete the stream and free its disk

Changes are refused (403 ``admin_disabled``) unless ``admin = true``; with
auth on they need a token like every write.  Each call is blocking storage
work: the app runs them on a worker thread.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import orjson

from storage_c import (
    CometError,
    GroupInfo,
    GroupNotFound,
    ResetTo,
    check_group_name,
    delete_group,
    reset_group,
)

from .errors import HTTPError, check_name, storage_error
from .runtime import Runtime


def _checked(runtime: Runtime, stream: str) -> None:
    check_name(stream)
    if runtime.log is None:
        raise HTTPError(503, "starting", "the worker has not opened the data directory yet",
                        retry_after=runtime.config.retry_after_s)


def _require_admin(runtime: Runtime, what: str) -> None:
    if not runtime.config.admin:
        raise HTTPError(403, "admin_disabled", f"{what} is off: set admin = true (COMET_ADMIN=1) "
                        "in the gateway's configuration to allow it")


def _storage_error(runtime: Runtime, exc: CometError) -> HTTPError:
    return storage_error(exc, runtime.config.retry_after_s)


def _group_infos(runtime: Runtime, stream: str) -> list[GroupInfo]:
    assert runtime.log is not None
    try:
        return runtime.log.groups(stream)
    except CometError as exc:
        raise _storage_error(runtime, exc) from None


def _by_group(infos: list[GroupInfo]) -> dict[str, dict[str, Any]]:
    """Each group with its lag over every shard and its position in each."""
    shards: dict[str, list[dict[str, Any]]] = {}
    for g in sorted(infos, key=lambda g: (g.name, g.shard)):
        shards.setdefault(g.name, []).append({k: v for k, v in asdict(g).items() if k != "name"})
    return {name: {"name": name, "lag": sum(s["lag"] for s in rows), "shards": rows}
            for name, rows in shards.items()}


def list_groups(runtime: Runtime, stream: str) -> dict[str, Any]:
    _checked(runtime, stream)
    return {"stream": stream, "groups": list(_by_group(_group_infos(runtime, stream)).values())}


def _checked_group(runtime: Runtime, stream: str, group: str) -> None:
    """The stream's name, then the group's (400 before anything is looked up)."""
    _checked(runtime, stream)
    try:
        check_group_name(group)
    except CometError as exc:
        raise _storage_error(runtime, exc) from None


def describe_group(runtime: Runtime, stream: str, group: str) -> dict[str, Any]:
    """One group's lag and its offset and lag in each shard where it is registered."""
    _checked_group(runtime, stream, group)
    groups = _by_group(_group_infos(runtime, stream))
    if group not in groups:
        known = f"known: {', '.join(groups)}" if groups else "it has none"
        missing = GroupNotFound(f"consumer group {group!r} is not registered in stream "
                                f"{stream!r} ({known})")
        raise _storage_error(runtime, missing)
    return {"stream": stream, **groups[group]}


MAX_RESET_BYTES = 4096
"""The largest body of a group reset (PUT); larger is 413."""


def parse_reset(body: bytes | bytearray) -> tuple[ResetTo, int | None]:
    try:
        spec = orjson.loads(body or b"{}")
    except orjson.JSONDecodeError as exc:
        raise HTTPError(400, "bad_parameter", f"the body is not JSON: {exc}") from None
    if not isinstance(spec, dict):
        raise HTTPError(400, "bad_parameter", "the body is a JSON object")
    shard = spec.get("shard")
    if shard is not None and (type(shard) is not int or shard < 0):
        raise HTTPError(400, "bad_parameter", "shard is a non-negative integer")
    given = [k for k in ("to", "to_entry", "to_time") if k in spec]
    if len(given) != 1:
        raise HTTPError(400, "bad_parameter", 'give exactly one of "to" ("earliest" or "latest"), '
                        '"to_entry" (an entry number) or "to_time" (ISO 8601 or unix seconds)')
    if given[0] == "to":
        if spec["to"] not in ("earliest", "latest"):
            raise HTTPError(400, "bad_parameter", '"to" is "earliest" or "latest"')
        return ResetTo(spec["to"]), shard
    if given[0] == "to_entry":
        if type(spec["to_entry"]) is not int or spec["to_entry"] < 0:
            raise HTTPError(400, "bad_parameter", "to_entry is a non-negative integer")
        return ResetTo("entry", spec["to_entry"]), shard
    try:
        return ResetTo.time(str(spec["to_time"])), shard
    except ValueError as exc:
        raise HTTPError(400, "bad_parameter", str(exc)) from None


def reset(runtime: Runtime, stream: str, group: str, body: bytes | bytearray) -> dict[str, Any]:
    _require_admin(runtime, "resetting a consumer group")
    _checked_group(runtime, stream, group)
    target, shard = parse_reset(body)
    assert runtime.log is not None
    try:
        results = reset_group(runtime.log, stream, group, target, shard)
        runtime.log.sync(stream)
    except CometError as exc:
        raise _storage_error(runtime, exc) from None
    return {"stream": stream, "group": group, "to": str(target),
            "shards": [asdict(r) for r in results]}


def remove_group(runtime: Runtime, stream: str, group: str) -> dict[str, Any]:
    _require_admin(runtime, "deleting a consumer group")
    _checked_group(runtime, stream, group)
    assert runtime.log is not None
    try:
        shards = delete_group(runtime.log, stream, group)
        runtime.log.sync(stream)
    except CometError as exc:
        raise _storage_error(runtime, exc) from None
    return {"stream": stream, "group": group, "deleted_from_shards": shards}


def remove_stream(runtime: Runtime, stream: str) -> dict[str, Any]:
    _require_admin(runtime, "deleting a stream")
    _checked(runtime, stream)
    assert runtime.log is not None
    try:
        runtime.log.delete_stream(stream)
    except CometError as exc:
        raise _storage_error(runtime, exc) from None
    return {"stream": stream, "deleted": True}
