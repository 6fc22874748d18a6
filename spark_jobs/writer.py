"""The Spark task of ``comet spark-ship``: parsed rows in, Parquet files out.

It runs through ``mapInArrow`` in the executors' Python workers and writes
with pyarrow (zstd Parquet), to a local directory or to S3 alike.  One task
reads one planned range of one shard, so its files are named after the run
and the task's partition number: a rerun of the same plan writes the same
names.  Rows are split by hour of their event time into
``stream=<s>/dt=<day>/hour=<hh>/``; entries that did not parse go to the
same layout under ``_rejects/`` with their bytes and the reason.

A file is written under a temporary name and renamed into the run's
staging prefix when whole (an S3 object appears only when its upload
completes), so a task killed midway leaves no partial file to publish.
The task yields one row per file; the driver publishes them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .arrow import TIMESTAMP
from .lakefs import Lake
from .plan import staging_rel

FILE_DDL = ("kind string, path string, rows long, bytes long, shard int, first_entry long, "
            "last_entry long")
FILE_SCHEMA = pa.schema([
    ("kind", pa.string()), ("path", pa.string()), ("rows", pa.int64()), ("bytes", pa.int64()),
    ("shard", pa.int32()), ("first_entry", pa.int64()), ("last_entry", pa.int64()),
])
META_COLUMNS = [pa.field("_comet_shard", pa.int32()), pa.field("_comet_entry", pa.int64()),
                pa.field("_comet_time", TIMESTAMP)]
REJECT_SCHEMA = pa.schema([
    ("stream", pa.string()), ("shard", pa.int32()), ("entry", pa.int64()), ("timestamp", TIMESTAMP),
    ("value", pa.binary()), ("error", pa.string()),
])
HOUR_US = 3_600_000_000
UNIT_TO_US = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": None}


def data_schema(value_type: pa.StructType) -> pa.Schema:
    return pa.schema(list(value_type) + META_COLUMNS)


def partition_dir(stream: str, hour: int) -> str:
    t = datetime.fromtimestamp(hour * 3600, tz=timezone.utc)
    return f"stream={stream}/dt={t:%Y-%m-%d}/hour={t:%H}"


@dataclass
class _OpenFile:
    writer: pq.ParquetWriter
    final: str
    temp: str
    staged: str
    shard: int
    rows: int = 0
    first: int = -1
    last: int = -1


@dataclass
class WriteTask:
    """Picklable: Spark ships it to the tasks."""

    lake: Lake
    stream: str
    run: int
    value_type: pa.StructType
    event_time_field: str | None = None
    event_time_unit: str = "ms"
    _open: dict[tuple[str, int], _OpenFile] = field(default_factory=dict, repr=False)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        task = ctx.partitionId() if ctx is not None else 0
        self._open = {}
        try:
            for batch in batches:
                self._write(batch, task)
            rows = [self._close(f) for f in self._open.values()]
        except BaseException:
            for f in self._open.values():
                _discard(self.lake, f)
            raise
        if rows:
            yield pa.RecordBatch.from_pylist(rows, schema=FILE_SCHEMA)

    # ---- splitting ------------------------------------------------------------------

    def _write(self, batch: pa.RecordBatch, task: int) -> None:
        if not batch.num_rows:
            return
        good = pc.is_null(batch.column("_error"))
        bad_count = batch.num_rows - pc.sum(good.cast(pa.int64())).as_py()
        if bad_count:
            self._write_rejects(batch.filter(pc.invert(good)), task)
            batch = batch.filter(good)
            if not batch.num_rows:
                return
        value = batch.column("value")
        columns = value.flatten() + [batch.column("shard"), batch.column("entry"),
                                     batch.column("timestamp")]
        out = pa.RecordBatch.from_arrays(columns, schema=data_schema(self.value_type))
        for hour, part in self._by_hour(out, self._event_hours(batch)):
            self._append("data", hour, task, part)

    def _write_rejects(self, batch: pa.RecordBatch, task: int) -> None:
        out = pa.RecordBatch.from_arrays(
            [batch.column("stream"), batch.column("shard"), batch.column("entry"),
             batch.column("timestamp"), batch.column("_corrupt_record"), batch.column("_error")],
            schema=REJECT_SCHEMA)
        hours = _hours_of(batch.column("timestamp"))
        for hour, part in self._by_hour(out, hours):
            self._append("rejects", hour, task, part)

    def _event_hours(self, batch: pa.RecordBatch) -> np.ndarray:
        ingest = batch.column("timestamp")
        if not self.event_time_field:
            return _hours_of(ingest)
        column = batch.column("value").field(self.event_time_field)
        if pa.types.is_timestamp(column.type):
            micros = column.cast(TIMESTAMP)
        else:
            factor = UNIT_TO_US[self.event_time_unit]
            numbers = column.cast(pa.int64(), safe=False)
            micros = (pc.divide(numbers, 1000) if factor is None
                      else pc.multiply(numbers, factor)).cast(pa.int64()).cast(TIMESTAMP)
        return _hours_of(pc.fill_null(micros, ingest))

    @staticmethod
    def _by_hour(batch: pa.RecordBatch, hours: np.ndarray) -> Iterator[tuple[int, pa.RecordBatch]]:
        first = hours[0]
        if (hours == first).all():  # the usual case: one hour per batch
            yield int(first), batch
            return
        for hour in np.unique(hours):
            yield int(hour), batch.filter(pa.array(hours == hour))

    # ---- files ------------------------------------------------------------------------

    def _append(self, kind: str, hour: int, task: int, part: pa.RecordBatch) -> None:
        f = self._open.get((kind, hour))
        if f is None:
            f = self._open[(kind, hour)] = self._create(kind, hour, task, part)
        f.writer.write_batch(part)
        entries = part.column("_comet_entry" if kind == "data" else "entry")
        lo, hi = pc.min_max(entries).values()
        f.first = lo.as_py() if f.first < 0 else min(f.first, lo.as_py())
        f.last = max(f.last, hi.as_py())
        f.rows += part.num_rows

    def _create(self, kind: str, hour: int, task: int, part: pa.RecordBatch) -> _OpenFile:
        name = f"part-{self.run:08d}-{task:05d}.zstd.parquet"
        final = f"{partition_dir(self.stream, hour)}/{name}"
        if kind == "rejects":
            final = f"_rejects/{final}"
        staged = f"{staging_rel(self.stream, self.run)}/{final}"
        temp = f"{staged}.{os.getpid()}.tmp"
        lake = self.lake
        if not lake.is_s3:
            os.makedirs(os.path.dirname(lake.path(temp)), exist_ok=True)
        shard_column = part.column("_comet_shard" if kind == "data" else "shard")
        writer = pq.ParquetWriter(lake.path(staged if lake.is_s3 else temp), part.schema,
                                  filesystem=lake.fs, compression="zstd")
        return _OpenFile(writer, final, temp, staged, int(shard_column[0].as_py()))

    def _close(self, f: _OpenFile) -> dict[str, object]:
        f.writer.close()
        lake = self.lake
        if not lake.is_s3:  # S3: the object appeared whole when its upload completed
            path = lake.path(f.temp)
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(path, lake.path(f.staged))
        size = lake.fs.get_file_info(lake.path(f.staged)).size
        return {"kind": "data" if not f.final.startswith("_rejects/") else "rejects",
                "path": f.final, "rows": f.rows, "bytes": size, "shard": f.shard,
                "first_entry": f.first, "last_entry": f.last}


def _hours_of(times: pa.Array) -> np.ndarray:
    micros = times.cast(pa.int64()).to_numpy(zero_copy_only=False)
    return micros // HOUR_US


def _discard(lake: Lake, f: _OpenFile) -> None:
    try:
        f.writer.close()  # completes the file: remove it, it is partial
        if lake.is_s3:
            lake.fs.delete_file(lake.path(f.staged))
        else:
            os.unlink(lake.path(f.temp))
    except Exception:  # the task is failing already; its own error matters
        pass
