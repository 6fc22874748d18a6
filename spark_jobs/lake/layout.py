"""The lake's layout: where a table's files go and what they hold.

Both tables partition by ``stream=<s>/dt=<day>/hour=<hh>/``, the layout every
export of the log shares (``comet.export``); the main table is the lake's
root, the rejects table ``_rejects/``.  A data file holds the value columns and
the ``_comet_`` columns below; a rejects file holds the entry, its bytes and
the reason.  ``WrittenFile`` is what a task that wrote one tells the commit
(``delta.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

import pyarrow as pa

from comet.export import HOUR_NS, partition_path

TIMESTAMP = pa.timestamp("us", tz="UTC")
META_COLUMNS = [pa.field("_comet_shard", pa.int32()), pa.field("_comet_entry", pa.int64()),
                pa.field("_comet_time", TIMESTAMP)]
_REJECT_COLUMNS: list[tuple[str, pa.DataType]] = [
    ("shard", pa.int32()), ("entry", pa.int64()), ("timestamp", TIMESTAMP),
    ("value", pa.binary()), ("error", pa.string()),
]
REJECT_SCHEMA = pa.schema(_REJECT_COLUMNS)
"""The rejects table's columns (``stream``, ``dt``, ``hour`` are its partitions)."""
REJECTS_DIR = "_rejects"


def partition_dir(stream: str, hour: int) -> str:
    """The table's partition of ``hour`` (hours since the epoch): the layout
    every export of the log shares."""
    return partition_path(stream, hour * HOUR_NS)


def partition_values(stream: str, hour: int) -> dict[str, str]:
    """The Delta partition values of ``hour`` (hours since the epoch)."""
    at = datetime.fromtimestamp(hour * 3600, tz=timezone.utc)
    return {"stream": stream, "dt": f"{at:%Y-%m-%d}", "hour": str(at.hour)}


@dataclass
class WrittenFile:
    """One Parquet file a task wrote: what the driver's commit needs."""

    kind: str
    """``data`` or ``rejects``."""
    path: str
    """Relative to its table's root."""
    task: int
    hour: int
    rows: int
    bytes: int
    shard: int
    first_entry: int
    last_entry: int
    first_time_us: int
    last_time_us: int
    value_type: pa.StructType | None = None
    """The value type the file was written with (data files)."""
