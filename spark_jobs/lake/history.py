"""``comet lake history``: what the lake's two Delta tables' logs say was done.

Every commit is one entry, newest first: its version, time and operation,
and for a run of ``comet spark-ship`` the summary the run wrote into the
commit (its ``comet.*`` metadata: shipper, run, ranges, rows, rejects,
missing).  Commits that are not runs (compaction, vacuum, added columns) are
listed too, with delta-rs's own parameters and metrics.

A history is read from the log as it is when the command runs: a commit
that lands meanwhile is simply not listed yet, and nothing is written.
"""

from __future__ import annotations

import json
import posixpath
from datetime import datetime, timezone
from typing import Any

from .delta import LOG_DIR, LakeTable
from .lakefs import Lake

RUN_KEYS = ("app", "stream", "group", "incarnation", "run", "ranges", "rows", "rejects", "missing")
OPERATION_KEY = "comet.operation"
"""Set by the ``comet lake`` commands on the commits they make."""
_NUMBERS = {"incarnation", "run", "rows", "rejects", "missing"}
_HIDDEN_PARAMETERS = {"metadata", "protocol"}  # a whole schema: ``comet lake check`` or the log says it


def history(lake: Lake, stream: str | None = None, limit: int | None = None) -> dict[str, Any]:
    """Both tables' commits, newest first (``limit``: the last so many of
    each, after ``stream`` chose them)."""
    return {"lake": lake.url, "tables": {t.name: table_history(t, stream, limit)
                                         for t in (LakeTable.main(lake), LakeTable.rejects(lake))}}


def table_history(table: LakeTable, stream: str | None, limit: int | None) -> list[dict[str, Any]]:
    opened = table.open()
    if opened is None:
        return []
    if stream is None:
        return [describe(c) for c in opened.history(limit)]
    read = max(4 * limit, 100) if limit else None
    while True:
        commits = opened.history(read)
        chosen = [describe(c) for c in commits if concerns(c, stream)]
        if read is None or limit is None or len(chosen) >= limit or len(commits) < read:
            return chosen[:limit] if limit else chosen
        read *= 4  # the stream's commits are further back: read more of the log


def concerns(commit: dict[str, Any], stream: str | None) -> bool:
    """A commit about ``stream``: its runs, and every commit that is no run (those act on the whole table, or on
    partitions their parameters name)."""
    if stream is None:
        return True
    if "comet.stream" in commit:
        return bool(commit["comet.stream"] == stream)
    return True


def describe(commit: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"version": commit.get("version"),
                           "timestamp": iso_ms(commit.get("timestamp")),
                           "operation": commit.get("operation")}
    if "comet.app" in commit:
        out["kind"] = "run"
        for key in RUN_KEYS:
            value = commit.get(f"comet.{key}")
            out[key] = (_int(value) if key in _NUMBERS else
                        _json(value, value) if key == "ranges" else value)
        return out
    out["kind"] = commit.get(OPERATION_KEY) or str(commit.get("operation") or "").lower()
    parameters = {k: v for k, v in (commit.get("operationParameters") or {}).items()
                  if k not in _HIDDEN_PARAMETERS}
    if parameters:
        out["parameters"] = parameters
    if commit.get("operationMetrics"):
        out["metrics"] = commit["operationMetrics"]
    return out


def iso_ms(millis: Any) -> str | None:
    if not isinstance(millis, int):
        return None
    at = datetime.fromtimestamp(millis / 1000, tz=timezone.utc)
    return f"{at:%Y-%m-%dT%H:%M:%S}.{millis % 1000:03d}Z"


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _json(text: Any, default: Any) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return default


def commit_actions(table: LakeTable, version: int) -> list[dict[str, Any]] | None:
    """The actions of one commit, read from the table's log (None: its file
    is gone, or does not read)."""
    path = posixpath.join(table.root, LOG_DIR, f"{version:020d}.json")
    try:
        with table.lake.fs.open_input_stream(path) as f:
            data = f.read()
        return [json.loads(line) for line in data.splitlines() if line.strip()]
    except (FileNotFoundError, ValueError):
        return None
