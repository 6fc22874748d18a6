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

import posixpath
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from .delta import PARTITIONS, LakeTable
from .lakefs import Lake


def table_of(lake: Lake, kind: str = "data") -> LakeTable:
    if kind not in ("data", "rejects"):
        raise ValueError(f"kind {kind!r}: data or rejects")
    return LakeTable.rejects(lake) if kind == "rejects" else LakeTable.main(lake)


def read_table(lake: Lake, stream: str | None = None, kind: str = "data") -> pa.Table:
    """Every committed row (of ``stream``, if given), partition columns included.

    The files are those of the table's current version, as its log lists
    them, with their partition values from the log; they are read with the
    lake's own pyarrow filesystem.  (deltalake's ``to_pyarrow_table`` reads
    through its Rust filesystem handler, whose threads make many a process
    abort as it exits: "terminate called without an active exception".)"""
    from .delta import arrow_schema

    table_ref = table_of(lake, kind)
    table = table_ref.open()
    if table is None:
        return pa.table({})
    schema = arrow_schema(table)
    names = set(PARTITIONS)
    actions = pa.table(cast(Any, table.get_add_actions(flatten=True)))
    paths, partitions = [], []
    for row in actions.select(["path"] + [f"partition.{n}" for n in PARTITIONS]).to_pylist():
        if stream is not None and row["partition.stream"] != stream:
            continue
        paths.append(posixpath.join(table_ref.root, row["path"]))
        partitions.append((pc.field("stream") == row["partition.stream"])
                          & (pc.field("dt") == row["partition.dt"])
                          & (pc.field("hour") == pa.scalar(int(row["partition.hour"]), pa.int32())))
    if not paths:
        return schema.empty_table()
    dataset = ds.FileSystemDataset.from_paths(paths, schema=schema, format=ds.ParquetFileFormat(),
                                              filesystem=lake.fs, partitions=partitions)
    columns = [f.name for f in schema if f.name not in names] + PARTITIONS
    return dataset.to_table(columns=columns)


def read_dataframe(spark: Any, lake: Lake, stream: str | None = None, kind: str = "data") -> Any:
    """The committed rows as a Spark DataFrame."""
    table = read_table(lake, stream, kind)
    if not table.num_columns:
        return spark.createDataFrame([], "stream string")
    return spark.createDataFrame(table)
