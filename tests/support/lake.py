"""What the tests of the Delta lake share: ``comet spark-ship``'s tasks run in
this process (no JVM: the protocol's tests take seconds), and the checks a
reader of the lake makes."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, cast

import pyarrow as pa

from spark_jobs.lake.read import read_table, table_of
from spark_jobs.lake.lakefs import Lake
from spark_jobs.lake.plan import Shipper
from storage_c import Config, Log


class _Partitioned:
    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def mapPartitions(self, job: Callable[[Iterator[Any]], Iterable[Any]]) -> _Partitioned:
        return _Partitioned(list(job(iter(self.items))))

    def collect(self) -> list[Any]:
        return self.items


class _Context:
    defaultParallelism = 1

    def parallelize(self, items: list[Any], slices: int) -> _Partitioned:
        return _Partitioned(list(items))


class InProcessSpark:
    """What ``spark_jobs.spark.ship`` uses of a Spark session, run in this process:
    the tasks are the real ``ShipTask``, called here instead of in an executor."""

    sparkContext = _Context()


def in_process() -> InProcessSpark:
    return InProcessSpark()


def entry_keys(table: pa.Table, shard: str = "_comet_shard", entry: str = "_comet_entry") -> list[tuple[int, int]]:
    shards = cast(list[int], table.column(shard).to_pylist())  # no nulls: the table's own columns
    return list(zip(shards, cast(list[int], table.column(entry).to_pylist())))


def check_exactly_once(lake: Lake, data_dir: Path, stream: str, cfg: Config,
                       group: str = "spark-ship") -> tuple[pa.Table, pa.Table]:
    """Every entry of the stream is in the lake once, as a row or a reject,
    and the group is acked to the end of every shard; the two tables."""
    rows = read_table(lake, stream)
    rejects = read_table(lake, stream, kind="rejects")
    keys = entry_keys(rows) if rows.num_columns else []
    if rejects.num_columns:
        keys += entry_keys(rejects, "shard", "entry")
    assert len(keys) == len(set(keys)), "an entry is in the lake twice"
    with Log(data_dir, cfg) as log:
        stored = {(s, e) for s in range(log.shard_count(stream))
                  for e in range(log.shard_stats(stream, s).first_entry,
                                 log.shard_stats(stream, s).next_entry)}
        assert set(keys) == stored
        for shard in range(log.shard_count(stream)):
            assert log.group(stream, shard, group, create=False).offset == \
                log.shard_stats(stream, shard).next_entry
    return rows, rejects


def committed_runs(lake: Lake, kind: str = "data") -> list[int]:
    """The runs committed to a table, oldest first (from the commits'
    ``comet.run`` metadata: commits that add columns carry none).  Not with
    an S3 server running in this process: deltalake 1.6 holds the GIL while
    it reads the history, and the server's thread never answers."""
    table = table_of(lake, kind).open()
    if table is None:
        return []
    return [int(c["comet.run"]) for c in reversed(table.history()) if "comet.run" in c]


def duckdb_table(table_root: str, query: str = "select * from delta_scan('{root}')") -> pa.Table:
    """A Delta table read by DuckDB, offline: its delta extension from the
    ``duckdb-ext-delta`` package, loaded from the file (DuckDB would
    download it)."""
    import importlib.util

    import duckdb

    spec = importlib.util.find_spec("duckdb_ext")  # a directory of files, no module
    assert spec is not None and spec.submodule_search_locations, "pip install duckdb-ext-delta"
    [extension] = [p for d in spec.submodule_search_locations
                   for p in Path(d).glob(f"extensions/v{duckdb.__version__}/*/delta.duckdb_extension")]
    con = duckdb.connect(config={"autoinstall_known_extensions": False,
                                 "autoload_known_extensions": False})
    try:
        con.execute(f"LOAD '{extension}'")
        return con.execute(query.format(root=table_root)).fetch_arrow_table()
    finally:
        con.close()


def shipper_of(data_dir: Path, stream: str, cfg: Config, group: str = "spark-ship") -> Shipper:
    """Who ships ``stream`` (as it is now: its incarnation) with ``group``."""
    with Log(data_dir, cfg) as log:
        return Shipper(stream, log.stream_created_ns(stream), group)


def committed_files(lake: Lake, kind: str = "data") -> list[str]:
    """The files a table's commits add, relative to its root."""
    table = table_of(lake, kind).open()
    if table is None:
        return []
    return sorted(str(path) for path in pa.table(table.get_add_actions()).column("path").to_pylist())
