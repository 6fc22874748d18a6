"""Run plans, and who ships: what makes ``comet spark-ship`` exactly once.

A shipper is one stream incarnation shipped by one consumer group: its
Delta application id ``comet-spark-ship/<stream>/<incarnation>/<group>``
names it in every commit it makes (the incarnation is the stream's creation
time in ns, so a deleted and re-created stream is a new shipper, starting
from entry 0).  Its runs are numbered from 1; the Delta ``txn`` action of
run *n* records version *n* for the application id, in the same commit as
the run's files, so "has run *n* committed" is one lookup
(``DeltaTable.transaction_version``), and no rerun can commit *n* twice.

A run is planned before any data moves: its number, the entry range of
every shard (from the group's offsets to a snapshot of the committed ends,
made durable in the log first), the value schema and the partitioning of
the work.  The plan is written to the lake; a crash before the run's commit
leaves it, and the next run redoes it.  Before its first commit the run
writes the plan again with the schema it settled on (``resolved``), so a
redo after that point parses exactly as the crashed attempt did.

Layout, under the lake root (``_``-prefixed: not part of either table)::

    _comet/runs/<stream>/<group>/<incarnation>/<run:08d>.json
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import pyarrow as pa

from .lakefs import Lake

FORMAT_VERSION = 2
RUNS_DIR = "_comet/runs"


@dataclass(frozen=True)
class Shipper:
    stream: str
    incarnation: int
    """The stream's creation time (ns): another value once it is deleted and created again."""
    group: str

    @property
    def app_id(self) -> str:
        return f"comet-spark-ship/{self.stream}/{self.incarnation}/{self.group}"

    @property
    def plans_dir(self) -> str:
        return f"{RUNS_DIR}/{self.stream}/{self.group}/{self.incarnation}"

    def plan_rel(self, run: int) -> str:
        return f"{self.plans_dir}/{run:08d}.json"


@dataclass
class RunPlan:
    run: int
    stream: str
    incarnation: int
    group: str
    ranges: dict[int, tuple[int, int]]
    """shard -> [start, end): entries this run ships."""
    value_schema: str
    """The value columns to parse with, as Delta (and Spark) StructType JSON."""
    evolve: bool
    """New fields become columns (no ``--schema``)."""
    entries_per_task: int
    event_time_field: str | None = None
    event_time_unit: str = "ms"
    otlp: str | None = None
    """The OTLP signal whose built-in schema ``value_schema`` is (``spark/otlp_schema.py``):
    the tasks read the events with ``otlp_rows.OtlpParser``."""
    resolved: bool = False
    """``value_schema`` is the run's final schema: a redo parses with it as it is."""
    created: float = field(default_factory=time.time)

    @property
    def shipper(self) -> Shipper:
        return Shipper(self.stream, self.incarnation, self.group)

    @property
    def entries(self) -> int:
        return sum(end - start for start, end in self.ranges.values())

    @property
    def ends(self) -> dict[int, int]:
        return {shard: end for shard, (_, end) in self.ranges.items()}

    @property
    def value_type(self) -> pa.StructType:
        return struct_from_json(self.value_schema)

    def to_json(self) -> bytes:
        doc = asdict(self)
        doc["version"] = FORMAT_VERSION
        doc["ranges"] = {str(s): [a, b] for s, (a, b) in sorted(self.ranges.items())}
        return json.dumps(doc, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes) -> RunPlan:
        try:
            doc = json.loads(data)
            version = doc.pop("version", None)
        except (ValueError, AttributeError):
            raise ValueError("the plan is not a JSON object (damaged?)") from None
        if version != FORMAT_VERSION:
            raise ValueError(f"plan format version {version!r} is not {FORMAT_VERSION}")
        doc["ranges"] = {int(s): (int(a), int(b)) for s, (a, b) in doc["ranges"].items()}
        return cls(**doc)


def struct_to_json(value_type: pa.StructType) -> str:
    """Delta's schema JSON of the value columns (Spark's StructType JSON too)."""
    import deltalake

    return str(deltalake.Schema.from_arrow(pa.schema(list(value_type))).to_json())


def struct_from_json(text: str) -> pa.StructType:
    import deltalake

    from .evolve import canonical

    # to_arrow() gives an Arrow C-interface schema, which pyarrow takes as it is
    schema = pa.schema(cast(Any, deltalake.Schema.from_json(text).to_arrow()))
    return cast(pa.StructType, canonical(pa.struct(list(schema))))


def write_plan(lake: Lake, plan: RunPlan) -> None:
    lake.write_atomically(plan.shipper.plan_rel(plan.run), plan.to_json())


def read_plan(lake: Lake, shipper: Shipper, run: int) -> RunPlan | None:
    data = lake.read(shipper.plan_rel(run))
    return RunPlan.from_json(data) if data is not None else None


def plan_runs(lake: Lake, shipper: Shipper) -> list[int]:
    out = []
    for name in lake.list(shipper.plans_dir):
        stem, _, ext = name.partition(".")
        if ext == "json" and stem.isdigit():
            out.append(int(stem))
    return sorted(out)


def remove_old_plans(lake: Lake, shipper: Shipper, committed: int) -> list[int]:
    """Removes the plans of committed runs before ``committed``: only the
    last committed run's (its ranges are where the next run starts) and a
    pending one are ever read."""
    old = [run for run in plan_runs(lake, shipper) if run < committed]
    for run in old:
        lake.delete(shipper.plan_rel(run))
    return old
