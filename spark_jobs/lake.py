"""Reading the lake that ``comet spark-ship`` writes: only what manifests list.

A file that no manifest lists belongs to a run that has not committed (it
crashed, or is publishing now); the next run of the job finishes or
rewrites it.  So readers start from the manifests:

    table = read_table(Lake("s3://bucket/lake"), "events")        # pyarrow
    df = read_dataframe(spark, Lake("/srv/lake"), "events")        # Spark

With plain Spark, the same for a local lake::

    files = manifested_files(lake, "events")
    spark.read.option("basePath", lake.root).parquet(*[lake.uri(f) for f in files])

(``spark.read.parquet(lake_root)`` alone also sees the files of a run in
progress.)  Spark reads S3 lakes through ``s3a://`` only with the Hadoop AWS
jars on its classpath; without them ``read_dataframe`` loads the files with
pyarrow and hands Spark the Arrow table.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds

from .lakefs import Lake
from .plan import manifests

_PARTITION_COLUMNS: list[tuple[str, pa.DataType]] = [
    ("stream", pa.string()), ("dt", pa.string()), ("hour", pa.int32())]
PARTITION_SCHEMA = pa.schema(_PARTITION_COLUMNS)
PARTITIONING = ds.partitioning(PARTITION_SCHEMA, flavor="hive")


def manifested_files(lake: Lake, stream: str, kind: str = "data") -> list[str]:
    """Lake-relative paths of the committed files of ``kind`` (data or rejects)."""
    return [f.path for m in manifests(lake, stream) for f in m.files if f.kind == kind]


def unmanifested_files(lake: Lake, stream: str) -> list[str]:
    """Parquet files of the stream in the lake that no manifest lists (a
    crashed run's, until its rerun commits them)."""
    import pyarrow.fs as pafs

    listed = set(manifested_files(lake, stream, "data")) | set(manifested_files(lake, stream, "rejects"))
    out = []
    for top in (f"stream={stream}", f"_rejects/stream={stream}"):
        selector = pafs.FileSelector(lake.path(top), recursive=True, allow_not_found=True)
        for info in lake.fs.get_file_info(selector):
            if info.type == pafs.FileType.File and info.path.endswith(".parquet"):
                rel = info.path[len(lake.root) + 1:]
                if rel not in listed:
                    out.append(rel)
    return sorted(out)


def read_table(lake: Lake, stream: str, kind: str = "data") -> pa.Table:
    """Every committed row of ``stream`` (with ``stream``, ``dt`` and ``hour``
    from the paths), the schemas of all runs unified."""
    files = manifested_files(lake, stream, kind)
    if not files:
        return pa.table({})
    paths = [lake.path(f) for f in files]
    base = lake.path("_rejects") if kind == "rejects" else lake.root
    schemas = [ds.dataset(p, filesystem=lake.fs, format="parquet").schema for p in paths]
    schema = pa.unify_schemas(schemas + [PARTITION_SCHEMA], promote_options="permissive")
    dataset = ds.dataset(paths, schema=schema, filesystem=lake.fs, format="parquet",
                         partitioning=PARTITIONING, partition_base_dir=base)
    return dataset.to_table()


def read_dataframe(spark: Any, lake: Lake, stream: str, kind: str = "data") -> Any:
    """The committed rows as a Spark DataFrame."""
    if lake.is_s3 or kind == "rejects":
        return spark.createDataFrame(read_table(lake, stream, kind))
    files = manifested_files(lake, stream, kind)
    if not files:
        return spark.createDataFrame([], "stream string")
    return (spark.read.option("basePath", lake.root).option("mergeSchema", "true")
            .parquet(*[lake.uri(f) for f in files]))
