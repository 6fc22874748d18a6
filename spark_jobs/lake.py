"""Reading the lake that ``comet spark-ship`` writes: two Delta Lake tables.

Any Delta reader reads it: Spark with Delta, Trino, Athena, DuckDB
(``delta_scan``), Polars (``pl.read_delta``), pandas through ``deltalake``.
The main table is the lake root, the rejects table ``<lake>/_rejects``.
Without another engine at hand::

    table = read_table(Lake("s3://bucket/lake"), "events")             # pyarrow
    df = read_dataframe(spark, Lake("/srv/lake"), "events")             # Spark

(``read_dataframe`` hands Spark the Arrow table: Spark reads Delta itself
only with the Delta Lake jars, which this project does not ship.)
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from .delta import LakeTable
from .lakefs import Lake


def table_of(lake: Lake, kind: str = "data") -> LakeTable:
    if kind not in ("data", "rejects"):
        raise ValueError(f"kind {kind!r}: data or rejects")
    return LakeTable.rejects(lake) if kind == "rejects" else LakeTable.main(lake)


def read_table(lake: Lake, stream: str | None = None, kind: str = "data") -> pa.Table:
    """Every committed row (of ``stream``, if given), partition columns included."""
    table = table_of(lake, kind).open()
    if table is None:
        return pa.table({})
    only = [("stream", "=", stream)] if stream is not None else None
    return table.to_pyarrow_table(filters=only)  # a partition filter: other streams' files are not read


def read_dataframe(spark: Any, lake: Lake, stream: str | None = None, kind: str = "data") -> Any:
    """The committed rows as a Spark DataFrame."""
    table = read_table(lake, stream, kind)
    if not table.num_columns:
        return spark.createDataFrame([], "stream string")
    return spark.createDataFrame(table)
