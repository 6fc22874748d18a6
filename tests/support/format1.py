"""A lake in format 1 (the manifests of the version before Delta), written as
that version's ``comet spark-ship`` wrote it (``git show main:spark_jobs/LAKE.md``):
per run a plan, data files ``stream=/dt=/hour=/part-<run>-<task>.zstd.parquet``
with the value columns and the ``_comet_`` columns, reject files under
``_rejects/`` with a ``stream`` column, a manifest, and the group's acks."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import pyarrow.parquet as pq

from storage_c import Log
from comet.export import partition_path

HOUR_NS = 3_600_000_000_000
TIMESTAMP = pa.timestamp("us", tz="UTC")
VALUE_TYPE = pa.struct([pa.field("id", pa.int64()), pa.field("device", pa.string())])
DDL = "`id` bigint, `device` string"


def write_run(lake: Path, log: Log, stream: str, run: int, ends: dict[int, int],
              group: str = "spark-ship", value_type: pa.StructType = VALUE_TYPE,
              manifest: bool = True, created: float | None = None) -> dict[int, tuple[int, int]]:
    """Run ``run``: from the last manifest's ends (or the group's offsets) to
    ``ends``; with ``manifest`` False, a run a crash stopped after it moved
    its files (plan, files, no manifest, no ack).  Its ranges."""
    meta = lake / "_comet" / stream
    starts = last_ends(lake, stream)
    ranges = {s: (starts.get(s, log.group(stream, s, group).offset), e) for s, e in ends.items()}
    created = created if created is not None else time.time()
    plan = {"version": 1, "run": run, "stream": stream, "group": group,
            "ranges": {str(s): list(r) for s, r in ranges.items()}, "value_ddl": DDL,
            "entries_per_task": 1_000_000, "event_time_field": None, "event_time_unit": "ms",
            "created": created}
    _write_json(meta / "plans" / f"{run:08d}.json", plan)
    files = []
    for task, (shard, (start, end)) in enumerate(sorted(ranges.items())):
        if start < end:
            files += _write_task(lake, log, stream, run, task, shard, start, end, value_type)
    if not manifest:
        return ranges
    rows = sum(f["rows"] for f in files if f["kind"] == "data")
    rejects = sum(f["rows"] for f in files if f["kind"] == "rejects")
    entries = sum(b - a for a, b in ranges.values())
    _write_json(meta / "manifests" / f"{run:08d}.json",
                {"version": 1, "run": run, "stream": stream, "group": group,
                 "ranges": plan["ranges"], "files": files, "rows": rows, "rejects": rejects,
                 "missing": entries - rows - rejects, "value_ddl": DDL, "created": created + 1})
    for shard, (start, end) in ranges.items():
        if start < end:
            log.group(stream, shard, group).ack(end - 1)
    return ranges


def last_ends(lake: Path, stream: str) -> dict[int, int]:
    manifests = sorted((lake / "_comet" / stream / "manifests").glob("*.json"))
    if not manifests:
        return {}
    doc = json.loads(manifests[-1].read_bytes())
    return {int(s): b for s, (_, b) in doc["ranges"].items()}


def _write_task(lake: Path, log: Log, stream: str, run: int, task: int, shard: int, start: int,
                end: int, value_type: pa.StructType) -> list[dict[str, Any]]:
    by_kind: dict[tuple[str, int], list[tuple[int, int, bytes]]] = {}
    entry = start
    while entry < end:
        batch = log.read(stream, shard, entry, max_entries=end - entry)
        for e, ts, payload in zip(batch.entries, batch.timestamps, batch.payloads):
            kind = "data" if payload.startswith(b"{") else "rejects"
            by_kind.setdefault((kind, ts // HOUR_NS), []).append((e, ts, payload))
        entry = batch.next_entry
    out = []
    for (kind, hour), items in sorted(by_kind.items()):
        rel = f"{partition_path(stream, hour * HOUR_NS)}/part-{run:08d}-{task:05d}.zstd.parquet"
        shards = pa.array([shard] * len(items), pa.int32())
        entries = pa.array([e for e, _, _ in items], pa.int64())
        times = pa.array([ts // 1000 for _, ts, _ in items], pa.int64()).cast(TIMESTAMP)
        if kind == "data":
            values = cast(pa.StructArray, pa.array([json.loads(p) for _, _, p in items], value_type))
            table = pa.Table.from_arrays(values.flatten() + [shards, entries, times],
                                         names=[f.name for f in value_type]
                                         + ["_comet_shard", "_comet_entry", "_comet_time"])
        else:
            rel = f"_rejects/{rel}"
            table = pa.table({"stream": pa.array([stream] * len(items)), "shard": shards,
                              "entry": entries, "timestamp": times,
                              "value": pa.array([p for _, _, p in items], pa.binary()),
                              "error": pa.array(["JSON parse error: Invalid value."] * len(items))})
        path = lake / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path, compression="zstd")
        out.append({"kind": kind, "path": rel, "rows": table.num_rows, "bytes": os.path.getsize(path),
                    "shard": shard, "first_entry": items[0][0], "last_entry": items[-1][0]})
    return out


def _write_json(path: Path, doc: dict[str, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))
