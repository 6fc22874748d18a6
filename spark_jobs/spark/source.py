"""The ``comet`` PySpark data source: a stream of the log as a DataFrame.

    spark_jobs.register(spark)
    df = (spark.read.format("comet").option("path", "./data").option("stream", "events")
          .option("startingOffsets", "group:lake").load())

Columns: ``stream string, shard int, entry long, timestamp timestamp, value
binary``.  With ``valueSchema`` (Spark DDL such as ``"device string, t
double"``, or a StructType's JSON) the values are parsed in the source, by
pyarrow's C++ JSON reader, and ``value`` becomes that struct; entries that
do not parse keep a null ``value``, their bytes in ``_corrupt_record`` and
the reason in ``_error``.

One Spark partition is one range of one shard (at most
``maxEntriesPerPartition`` entries).  Partitions read through the storage
API in the executors' Python workers, lock-free, and return Arrow batches
built from the reader's buffers.

Streaming offsets are ``{"<shard>": next entry}``.  ``latestOffset`` takes
the 4.2+ arguments (``start``, a ``ReadLimit``) and works without them on
4.0/4.1; ``maxEntriesPerTrigger`` caps a micro-batch; Trigger.AvailableNow
stops at the ends seen when the query started.  ``commit`` does nothing:
the log is trimmed by retention and consumer groups, not by Spark.
"""

from __future__ import annotations

import threading
from typing import Any, Iterator, Sequence, cast

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from storage_c import Log, StreamNotFound

from . import arrow
from .offsets import (
    Offsets,
    SourceOptions,
    bounds,
    cap,
    from_json,
    open_log,
    resolve_end,
    resolve_start,
    shard_list,
    to_json,
)
from .schema import value_ddl

try:  # Spark 4.2+
    from pyspark.sql.streaming.datasource import ReadMaxRows, SupportsTriggerAvailableNow
except ImportError:  # Spark 4.0/4.1: no admission control, no AvailableNow hook
    ReadMaxRows = None  # type: ignore[assignment,misc]  # None: checked before each use

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]  # an empty base in its place
        pass


PARSED_EXTRA = "_error string, _corrupt_record binary"


class RangePartition(InputPartition):
    """Entries ``start`` (inclusive) to ``end`` (exclusive) of one shard."""

    def __init__(self, shard: int, start: int, end: int) -> None:
        super().__init__((shard, start, end))
        self.shard = shard
        self.start = start
        self.end = end

    def __repr__(self) -> str:
        return f"RangePartition(shard={self.shard}, {self.start}..{self.end})"


def split(starts: Offsets, ends: Offsets, most: int) -> list[RangePartition]:
    out = []
    for shard in sorted(ends):
        end = ends[shard]
        position = starts.get(shard, end)
        while position < end:
            stop = min(position + most, end)
            out.append(RangePartition(shard, position, stop))
            position = stop
    return out


# Python workers are reused between tasks: keep one open log per data directory.
_logs: dict[str, Log] = {}
_logs_lock = threading.Lock()


def shared_log(path: str, stream: str | None = None, incarnation: int | None = None) -> Log:
    """The worker's open log of ``path``.  With ``incarnation``: opened
    again if its handle of ``stream`` is of another incarnation - a worker
    kept from earlier jobs may hold the handle of a stream deleted and
    created again since, whose reads fail."""
    with _logs_lock:
        log = _logs.get(path)
        if log is not None and not log.closed and incarnation is not None \
                and _created_ns(log, stream) != incarnation:
            log.close()
        if log is None or log.closed:
            log = _logs[path] = open_log(path)
        return log


def _created_ns(log: Log, stream: str | None) -> int | None:
    try:
        return log.stream_created_ns(stream) if stream is not None else None
    except StreamNotFound:
        return None


class _Reading:
    """What batch and stream readers share: the options, the schema, read()."""

    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        self.opts = opts
        self.value_type = value_struct(schema)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, RangePartition):
            return  # Spark's stand-in partition when there is nothing to read
        log = shared_log(self.opts.path)
        o = self.opts
        if self.value_type is None:
            yield from arrow.raw_batches(log, o.stream, partition.shard, partition.start,
                                         partition.end, o.batch_rows, o.batch_bytes)
        else:
            parser = arrow.JsonParser(self.value_type)
            yield from arrow.parsed_batches(log, parser, o.stream, partition.shard,
                                            partition.start, partition.end, o.batch_rows,
                                            o.batch_bytes)


def value_struct(schema: StructType) -> pa.StructType | None:
    """None for the raw columns; the Arrow type of ``value`` when parsed."""
    from pyspark.sql.pandas.types import to_arrow_type

    names = [f.name for f in schema.fields]
    if names == ["stream", "shard", "entry", "timestamp", "value"] \
            and schema["value"].dataType.typeName() == "binary":
        return None
    if names != ["stream", "shard", "entry", "timestamp", "value", "_error", "_corrupt_record"] \
            or not isinstance(schema["value"].dataType, StructType):
        raise ValueError(
            "the comet source's columns are stream, shard, entry, timestamp, value (binary); "
            "with a parsed value: stream, shard, entry, timestamp, value struct<...>, "
            f"_error, _corrupt_record - not {schema.simpleString()}")
    return cast(pa.StructType, to_arrow_type(schema["value"].dataType, timezone="UTC"))  # of a struct


class CometDataSource(DataSource):
    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.opts = SourceOptions.parse(options)

    @classmethod
    def name(cls) -> str:
        return "comet"

    def schema(self) -> str:
        if self.opts.value_schema:
            return (f"{arrow.RAW_DDL.rsplit(',', 1)[0]}, "
                    f"value struct<{value_ddl(self.opts.value_schema)}>, {PARSED_EXTRA}")
        return arrow.RAW_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return CometBatchReader(self.opts, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return CometStreamReader(self.opts, schema)


class CometBatchReader(_Reading, DataSourceReader):
    def partitions(self) -> Sequence[InputPartition]:
        with open_log(self.opts.path) as log:
            shards = shard_list(log, self.opts)
            starts = resolve_start(log, self.opts, shards, self.opts.starting)
            ends = resolve_end(log, self.opts, shards)
        return split(starts, ends, self.opts.entries_per_partition)


class CometStreamReader(_Reading, DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        super().__init__(opts, schema)
        self._target: Offsets | None = None  # Trigger.AvailableNow's end
        self._last: Offsets | None = None

    def _ends(self) -> Offsets:
        with open_log(self.opts.path) as log:
            shards = shard_list(log, self.opts)
            return {s: bounds(log, self.opts.stream, s)[1] for s in shards}

    def initialOffset(self) -> dict[str, int]:
        with open_log(self.opts.path) as log:
            shards = shard_list(log, self.opts)
            start = resolve_start(log, self.opts, shards, self.opts.starting)
        self._last = start
        return to_json(start)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._ends()

    def getDefaultReadLimit(self) -> Any:
        if self.opts.max_entries_per_trigger and ReadMaxRows is not None:
            return ReadMaxRows(self.opts.max_entries_per_trigger)
        return super().getDefaultReadLimit()

    def latestOffset(self, start: dict[str, int] | None = None, limit: Any = None) -> dict[str, int]:
        """The end of the next micro-batch.  Spark 4.0/4.1 call it without
        arguments: the start is then the end this reader returned last."""
        ends = self._target if self._target is not None else self._ends()
        begin = from_json(start) if start is not None else (self._last or {})
        most = None
        if limit is not None and ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            most = limit.max_rows
        elif start is None and self.opts.max_entries_per_trigger:
            most = self.opts.max_entries_per_trigger
        out = cap(begin, ends, most)
        self._last = out
        return to_json(out)

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        return split(from_json(start), from_json(end), self.opts.entries_per_partition)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to do: Spark's checkpoint holds the position."""
