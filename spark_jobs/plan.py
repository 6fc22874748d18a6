"""Run plans and manifests: what makes ``comet spark-ship`` exactly once.

A run is planned before any data moves: its number, the entry range of
every shard (from the group's offsets to a snapshot of the committed ends),
the value schema and the partitioning of the work.  The plan is written to
the lake first; every output file's name follows from it.  A run then
writes its files under a staging prefix, moves them to their final names,
writes its manifest (the commit point: the list of files and the ranges),
and only then acks the group.

A crash anywhere leaves one of three states, each finished by the next run:
a plan without a manifest (the run is redone from its plan, rewriting the
same names), a manifest whose ranges the group has not acked (the ack is
redone), or nothing to resume.  Readers of the lake trust only files listed
by a manifest.

Layout, under the lake root::

    _comet/<stream>/plans/<run:08d>.json
    _comet/<stream>/manifests/<run:08d>.json
    _comet/<stream>/staging/<run:08d>/...      (removed once published)
    stream=<stream>/dt=YYYY-MM-DD/hour=HH/part-<run:08d>-<task:05d>.zstd.parquet
    _rejects/stream=<stream>/dt=YYYY-MM-DD/hour=HH/part-<run:08d>-<task:05d>.zstd.parquet
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from .lakefs import Lake

FORMAT_VERSION = 1


def meta_dir(stream: str) -> str:
    return f"_comet/{stream}"


def plan_rel(stream: str, run: int) -> str:
    return f"{meta_dir(stream)}/plans/{run:08d}.json"


def manifest_rel(stream: str, run: int) -> str:
    return f"{meta_dir(stream)}/manifests/{run:08d}.json"


def staging_rel(stream: str, run: int) -> str:
    return f"{meta_dir(stream)}/staging/{run:08d}"


@dataclass
class RunPlan:
    run: int
    stream: str
    group: str
    ranges: dict[int, tuple[int, int]]
    """shard -> [start, end): entries this run ships."""
    value_ddl: str
    entries_per_task: int
    event_time_field: str | None = None
    event_time_unit: str = "ms"
    created: float = field(default_factory=time.time)

    @property
    def entries(self) -> int:
        return sum(end - start for start, end in self.ranges.values())

    def to_json(self) -> bytes:
        return _dump(self)

    @classmethod
    def from_json(cls, data: bytes) -> RunPlan:
        return cls(**_load(data, "plan"))


@dataclass
class ShippedFile:
    kind: str
    """``data`` or ``rejects``."""
    path: str
    """Relative to the lake root."""
    rows: int
    bytes: int
    shard: int
    first_entry: int
    last_entry: int


@dataclass
class Manifest:
    run: int
    stream: str
    group: str
    ranges: dict[int, tuple[int, int]]
    files: list[ShippedFile]
    rows: int
    rejects: int
    missing: int
    """Planned entries the log no longer held (deleted by retention)."""
    value_ddl: str
    created: float = field(default_factory=time.time)

    def to_json(self) -> bytes:
        return _dump(self)

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        doc = _load(data, "manifest")
        doc["files"] = [ShippedFile(**f) for f in doc["files"]]
        return cls(**doc)


def _dump(document: RunPlan | Manifest) -> bytes:
    doc = asdict(document)
    doc["version"] = FORMAT_VERSION
    doc["ranges"] = {str(s): [a, b] for s, (a, b) in sorted(document.ranges.items())}
    return json.dumps(doc, indent=1).encode()


def _load(data: bytes, what: str) -> dict[str, Any]:
    """A plan's or manifest's fields (shard keys back to ints), or a clear error."""
    try:
        doc = json.loads(data)
        version = doc.pop("version", None)
    except (ValueError, AttributeError):
        raise ValueError(f"the {what} is not a JSON object (damaged?)") from None
    if version != FORMAT_VERSION:
        raise ValueError(f"{what} format version {version!r} is not {FORMAT_VERSION}")
    doc["ranges"] = {int(s): (int(a), int(b)) for s, (a, b) in doc["ranges"].items()}
    return doc


def _runs(lake: Lake, rel: str) -> list[int]:
    out = []
    for name in lake.list(rel):
        stem, dot, ext = name.partition(".")
        if ext == "json" and stem.isdigit():
            out.append(int(stem))
    return sorted(out)


def plan_runs(lake: Lake, stream: str) -> list[int]:
    return _runs(lake, f"{meta_dir(stream)}/plans")


def manifest_runs(lake: Lake, stream: str) -> list[int]:
    return _runs(lake, f"{meta_dir(stream)}/manifests")


def read_plan(lake: Lake, stream: str, run: int) -> RunPlan:
    data = lake.read(plan_rel(stream, run))
    if data is None:
        raise FileNotFoundError(f"no plan for run {run} of {stream!r} in {lake.url}")
    return RunPlan.from_json(data)


def read_manifest(lake: Lake, stream: str, run: int) -> Manifest:
    data = lake.read(manifest_rel(stream, run))
    if data is None:
        raise FileNotFoundError(f"no manifest for run {run} of {stream!r} in {lake.url}")
    return Manifest.from_json(data)


def manifests(lake: Lake, stream: str) -> list[Manifest]:
    return [read_manifest(lake, stream, run) for run in manifest_runs(lake, stream)]
