"""The Spark task of ``comet spark-ship``: one planned range in, Parquet files out.

A task runs in an executor's Python worker and does the whole data path
there, in native code: the C reader joins the range's payloads into one
buffer, pyarrow's C++ JSON reader parses it against the value schema
(``arrow.JsonParser``, rejects included; without ``--schema`` the schema
grows with new fields, ``lake/evolve.py``), and pyarrow writes zstd Parquet to a
local directory or to S3.  The rows never go through the JVM - Spark
schedules, retries and collects the file lists; moving every row to the
JVM and back to Python for writing would cost more than the rest together.

Rows are split by hour of their event time into the table's partitions
``stream=<s>/dt=<day>/hour=<hh>/``; entries that did not parse go to the
same layout in the rejects table (``_rejects/``) with their bytes and the
reason.  Files go straight to their final names, which carry the run, the
task and the attempt: a file is part of the table only once the driver's
Delta commit adds it, so a file of a crashed attempt is never read (and
``comet lake vacuum`` removes it).  Locally a file is written under a
temporary name in ``_comet/tmp/`` and renamed into the table when whole
and synced; an S3 object
appears only when its upload completes.  Each file's description carries
what the commit needs: size, rows, the statistics of the ``_comet_``
columns, and the value type it was written with (the schema may have grown
during the task: a new type starts a new file).
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from typing import Any, Iterator, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from comet.files import make_dirs_durably, publish_durably
from storage_c import StreamNotFound

from ..lake.lakefs import Lake
from ..lake.layout import META_COLUMNS, REJECT_SCHEMA, REJECTS_DIR, TIMESTAMP, WrittenFile, partition_dir
from .arrow import BatchParser, JsonParser, parsed_batches
from .source import RangePartition, shared_log

HOUR_US = 3_600_000_000
PARQUET_OPTIONS: dict[str, Any] = {"compression": "zstd"}  # pyarrow's zstd level (1): fast, half snappy's size
UNIT_TO_US = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": None}


def data_schema(value_type: pa.StructType) -> pa.Schema:
    return pa.schema(list(value_type) + META_COLUMNS)


@dataclass
class _OpenFile:
    writer: pq.ParquetWriter
    kind: str
    hour: int
    path: str
    temp: str
    shard: int
    value_type: pa.StructType | None
    rows: int = 0
    first: int = -1
    last: int = -1
    first_time: int = -1
    last_time: int = -1


@dataclass
class ShipTask:
    """Picklable: Spark ships it to the executors, with (task number, range) items."""

    data_dir: str
    lake: Lake
    stream: str
    run: int
    attempt: str
    """Part of every file name: a redo of the run never writes over a file of an earlier attempt."""
    temp_rel: str
    """A local lake's directory for files being written (renamed into the table when whole)."""
    value_type: pa.StructType
    evolve: bool = False
    event_time_field: str | None = None
    event_time_unit: str = "ms"
    batch_rows: int = 50_000
    batch_bytes: int = 64 << 20
    fixed: tuple[str, ...] | None = None
    """With ``evolve``: the table's columns, whose types never change; the
    run's other fields (from its sample) may still widen from long to double."""
    incarnation: int | None = None
    """The stream's incarnation the run was planned for (None: not checked)."""
    otlp: str | None = None
    """The OTLP signal of the stream's events: they are read by ``otlp_rows.OtlpParser``."""

    def __call__(self, items: Iterator[tuple[int, RangePartition]]) -> Iterator[WrittenFile]:
        log = shared_log(self.data_dir, self.stream, self.incarnation)
        if self.incarnation is not None and log.stream_created_ns(self.stream) != self.incarnation:
            raise StreamNotFound(f"stream {self.stream!r} was deleted and created again since "
                                 f"run {self.run} was planned: that run cannot finish")
        for task, part in items:
            parser = self.parser()
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

    def parser(self) -> BatchParser:
        """A task's parser (with ``evolve``, its own growth of the schema)."""
        if self.otlp:
            from .otlp_rows import OtlpParser

            return OtlpParser(self.value_type)
        return JsonParser(self.value_type, self.evolve, self.fixed)


class PartitionWriter:
    """The open files of one task, one per (kind, hour)."""

    def __init__(self, job: ShipTask, task: int) -> None:
        self.job = job
        self.lake = job.lake
        self.stream = job.stream
        self.task = task
        self._open: dict[tuple[str, int], _OpenFile] = {}
        self._closed: list[WrittenFile] = []
        self._count = 0

    def write(self, batch: pa.RecordBatch) -> None:
        if not batch.num_rows:
            return
        good = pc.is_null(batch.column("_error"))
        bad_count = batch.num_rows - pc.sum(good.cast(pa.int64())).as_py()
        if bad_count:
            self._write_rejects(batch.filter(pc.invert(good)))
            batch = batch.filter(good)
            if not batch.num_rows:
                return
        value = cast(pa.StructArray, batch.column("value"))  # the parsed values: a struct
        value_type = value.type
        columns = value.flatten() + [batch.column("shard"), batch.column("entry"),
                                     batch.column("timestamp")]
        out = pa.RecordBatch.from_arrays(columns, schema=data_schema(value_type))
        for hour, part in _by_hour(out, self._event_hours(batch)):
            self._append("data", hour, part, value_type)

    def close(self) -> list[WrittenFile]:
        for f in list(self._open.values()):
            self._closed.append(self._close(f))
        self._open.clear()
        return self._closed

    def discard(self) -> None:
        for f in self._open.values():
            _discard(self.lake, f)
        self._open.clear()

    # ---- splitting ------------------------------------------------------------------

    def _write_rejects(self, batch: pa.RecordBatch) -> None:
        shards = batch.column("shard").to_pylist()
        entries = batch.column("entry").to_pylist()
        reasons = [f"shard {s} entry {e}: {why}"
                   for s, e, why in zip(shards, entries, batch.column("_error").to_pylist())]
        out = pa.RecordBatch.from_arrays(
            [batch.column("shard"), batch.column("entry"), batch.column("timestamp"),
             batch.column("_corrupt_record"), pa.array(reasons, pa.string())],
            schema=REJECT_SCHEMA)
        for hour, part in _by_hour(out, _hours_of(batch.column("timestamp"))):
            self._append("rejects", hour, part, None)

    def _event_hours(self, batch: pa.RecordBatch) -> np.ndarray:
        ingest = batch.column("timestamp")
        field_name = self.job.event_time_field
        if not field_name:
            return _hours_of(ingest)
        column = cast(pa.StructArray, batch.column("value")).field(field_name)
        if pa.types.is_timestamp(column.type):
            micros = column.cast(TIMESTAMP)
        else:
            factor = UNIT_TO_US[self.job.event_time_unit]
            numbers = column.cast(pa.int64(), safe=False)
            micros = (pc.divide(numbers, 1000) if factor is None
                      else pc.multiply(numbers, factor)).cast(pa.int64()).cast(TIMESTAMP)
        return _hours_of(pc.fill_null(micros, ingest))

    # ---- files ------------------------------------------------------------------------

    def _append(self, kind: str, hour: int, part: pa.RecordBatch,
                value_type: pa.StructType | None) -> None:
        f = self._open.get((kind, hour))
        if f is not None and f.value_type != value_type:  # the schema grew: a new file
            self._closed.append(self._close(f))
            f = None
        if f is None:
            f = self._open[(kind, hour)] = self._create(kind, hour, part, value_type)
        f.writer.write_batch(part)
        meta = ("_comet_entry", "_comet_time") if kind == "data" else ("entry", "timestamp")
        lo, hi = pc.min_max(part.column(meta[0])).values()
        t_lo, t_hi = pc.min_max(part.column(meta[1]).cast(pa.int64())).values()
        f.first = lo.as_py() if f.first < 0 else min(f.first, lo.as_py())
        f.last = max(f.last, hi.as_py())
        f.first_time = t_lo.as_py() if f.first_time < 0 else min(f.first_time, t_lo.as_py())
        f.last_time = max(f.last_time, t_hi.as_py())
        f.rows += part.num_rows

    def _create(self, kind: str, hour: int, part: pa.RecordBatch,
                value_type: pa.StructType | None) -> _OpenFile:
        self._count += 1
        job = self.job
        name = f"part-{job.run:08d}-{self.task:05d}-{self._count:03d}-{job.attempt}.zstd.parquet"
        rel = f"{partition_dir(self.stream, hour)}/{name}"
        table_root = self.lake.path(REJECTS_DIR) if kind == "rejects" else self.lake.root
        final = posixpath.join(table_root, rel)
        temp = self.lake.path(job.temp_rel, f"{name}.{os.getpid()}.tmp")
        if not self.lake.is_s3:
            os.makedirs(posixpath.dirname(temp), exist_ok=True)
            make_dirs_durably(posixpath.dirname(final), self.lake.root)
        shard_column = part.column("_comet_shard" if kind == "data" else "shard")
        writer = pq.ParquetWriter(final if self.lake.is_s3 else temp, part.schema,
                                  filesystem=self.lake.fs, **PARQUET_OPTIONS)
        return _OpenFile(writer, kind, hour, rel, temp, int(shard_column[0].as_py()), value_type)

    def _close(self, f: _OpenFile) -> WrittenFile:
        f.writer.close()
        table_root = self.lake.path(REJECTS_DIR) if f.kind == "rejects" else self.lake.root
        final = posixpath.join(table_root, f.path)
        if not self.lake.is_s3:  # S3: the object appeared whole when its upload completed
            publish_durably(f.temp, final)
        size = self.lake.fs.get_file_info(final).size
        return WrittenFile(f.kind, f.path, self.task, f.hour, f.rows, size, f.shard, f.first,
                           f.last, f.first_time, f.last_time, f.value_type)


def _by_hour(batch: pa.RecordBatch, hours: np.ndarray) -> Iterator[tuple[int, pa.RecordBatch]]:
    first = hours[0]
    if (hours == first).all():  # the usual case: one hour per batch
        yield int(first), batch
        return
    for hour in np.unique(hours):
        yield int(hour), batch.filter(pa.array(hours == hour))


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
            root = lake.path(REJECTS_DIR) if f.kind == "rejects" else lake.root
            lake.fs.delete_file(posixpath.join(root, f.path))
        else:
            os.unlink(f.temp)
    except Exception:  # the task is failing already; its own error matters
        pass
