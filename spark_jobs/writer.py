"""The Spark task of ``comet spark-ship``: one planned range in, Parquet files out.

A task runs in an executor's Python worker and does the whole data path
there, in native code: the C reader joins the range's payloads into one
buffer, pyarrow's C++ JSON reader parses it against the value schema
(``arrow.JsonParser``, rejects included), and pyarrow writes zstd Parquet
to a local directory or to S3.  The rows never go through the JVM - Spark
schedules, retries and collects the file lists; moving every row to the
JVM and back to Python for writing would cost more than the rest together.

Files are named after the run and the task's number in the plan, so a
rerun of the same plan writes the same names.  Rows are split by hour of
their event time into ``stream=<s>/dt=<day>/hour=<hh>/``; entries that did
not parse go to the same layout under ``_rejects/`` with their bytes and the
reason.  A file is written under a temporary name and renamed into the
run's staging prefix when whole (an S3 object appears only when its upload
completes), so a task killed midway leaves no partial file to publish.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterator, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from storage_c.export import HOUR_NS, partition_path
from storage_c.files import publish_durably

from .arrow import TIMESTAMP, JsonParser, parsed_batches
from .lakefs import Lake
from .plan import staging_rel
from .source import RangePartition, shared_log

META_COLUMNS = [pa.field("_comet_shard", pa.int32()), pa.field("_comet_entry", pa.int64()),
                pa.field("_comet_time", TIMESTAMP)]
_REJECT_COLUMNS: list[tuple[str, pa.DataType]] = [
    ("stream", pa.string()), ("shard", pa.int32()), ("entry", pa.int64()), ("timestamp", TIMESTAMP),
    ("value", pa.binary()), ("error", pa.string()),
]
REJECT_SCHEMA = pa.schema(_REJECT_COLUMNS)
HOUR_US = 3_600_000_000
PARQUET_OPTIONS: dict[str, Any] = {"compression": "zstd"}  # pyarrow's zstd level (1): fast, half snappy's size
UNIT_TO_US = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": None}


def data_schema(value_type: pa.StructType) -> pa.Schema:
    return pa.schema(list(value_type) + META_COLUMNS)


def partition_dir(stream: str, hour: int) -> str:
    """The lake's partition of ``hour`` (hours since the epoch): the layout
    every export of the log shares."""
    return partition_path(stream, hour * HOUR_NS)


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
class ShipTask:
    """Picklable: Spark ships it to the executors, with (task number, range) items."""

    data_dir: str
    lake: Lake
    stream: str
    run: int
    value_type: pa.StructType
    event_time_field: str | None = None
    event_time_unit: str = "ms"
    batch_rows: int = 50_000
    batch_bytes: int = 64 << 20

    def __call__(self, items: Iterator[tuple[int, RangePartition]]) -> Iterator[dict[str, object]]:
        log = shared_log(self.data_dir)
        parser = JsonParser(self.value_type)
        for task, part in items:
            writer = PartitionWriter(self, task)
            try:
                for batch in parsed_batches(log, parser, self.stream, part.shard, part.start,
                                            part.end, self.batch_rows, self.batch_bytes):
                    writer.write(batch)
                files = writer.close()
            except BaseException:
                writer.discard()
                raise
            yield from files


class PartitionWriter:
    """The open files of one task, one per (kind, hour)."""

    def __init__(self, job: ShipTask, task: int) -> None:
        self.lake = job.lake
        self.stream = job.stream
        self.run = job.run
        self.value_type = job.value_type
        self.event_time_field = job.event_time_field
        self.event_time_unit = job.event_time_unit
        self.task = task
        self._open: dict[tuple[str, int], _OpenFile] = {}

    def write(self, batch: pa.RecordBatch) -> None:
        self._write(batch, self.task)

    def close(self) -> list[dict[str, object]]:
        return [self._close(f) for f in self._open.values()]

    def discard(self) -> None:
        for f in self._open.values():
            _discard(self.lake, f)

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
        value = cast(pa.StructArray, batch.column("value"))  # the parsed values: a struct
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
        column = cast(pa.StructArray, batch.column("value")).field(self.event_time_field)
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
                                  filesystem=lake.fs, **PARQUET_OPTIONS)
        return _OpenFile(writer, final, temp, staged, int(shard_column[0].as_py()))

    def _close(self, f: _OpenFile) -> dict[str, object]:
        f.writer.close()
        lake = self.lake
        if not lake.is_s3:  # S3: the object appeared whole when its upload completed
            publish_durably(lake.path(f.temp), lake.path(f.staged))
        size = lake.fs.get_file_info(lake.path(f.staged)).size
        return {"kind": "data" if not f.final.startswith("_rejects/") else "rejects",
                "path": f.final, "rows": f.rows, "bytes": size, "shard": f.shard,
                "first_entry": f.first, "last_entry": f.last}


def _hours_of(times: pa.Array) -> np.ndarray:
    """Hours since the epoch of null-free timestamps (numpy straight from the
    Arrow buffer: to_numpy's general path would import pandas)."""
    micros = times.cast(pa.int64())
    values = np.frombuffer(micros.buffers()[1],  # type: ignore[call-overload]  # a pa.Buffer, a buffer
                           dtype=np.int64, count=len(micros) + micros.offset)
    return values[micros.offset:] // HOUR_US


def _discard(lake: Lake, f: _OpenFile) -> None:
    try:
        f.writer.close()  # completes the file: remove it, it is partial
        if lake.is_s3:
            lake.fs.delete_file(lake.path(f.staged))
        else:
            os.unlink(lake.path(f.temp))
    except Exception:  # the task is failing already; its own error matters
        pass
