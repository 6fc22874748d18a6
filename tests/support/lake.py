"""What the tests of the Delta lake share: ``comet spark-ship``'s tasks run in
this process (no JVM: the protocol's tests take seconds), and the checks a
reader of the lake makes."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import pyarrow as pa

from spark_jobs.lake import read_table
from spark_jobs.lakefs import Lake
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
    """What ``spark_jobs.ship`` uses of a Spark session, run in this process:
    the tasks are the real ``ShipTask``, called here instead of in an executor."""

    sparkContext = _Context()


def in_process() -> InProcessSpark:
    return InProcessSpark()


def entry_keys(table: pa.Table, shard: str = "_comet_shard", entry: str = "_comet_entry") -> list[tuple[int, int]]:
    shards: list[int] = table.column(shard).to_pylist()  # type: ignore[assignment]  # no nulls
    entries: list[int] = table.column(entry).to_pylist()  # type: ignore[assignment]  # no nulls
    return list(zip(shards, entries))


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
