"""Log reads as Arrow record batches, built from the C reader's buffers.

Raw mode: the reader fills one payload buffer plus int32 offsets (Arrow's
binary layout), entry numbers and timestamps; each becomes an Arrow buffer
as it is, so a batch costs a few numpy operations, not work per row.
Spark takes ``binary`` (int32 offsets), never ``large_binary``, which is why
batches stay well under 2 GiB (``batch_bytes``).

Parsed mode (a value schema is given): the reader joins the payloads with
newlines in one buffer and pyarrow's C++ JSON reader turns it into typed
columns, which are smaller than JSON text for Spark to move and need no
parsing in the JVM.  Entries that do not parse (not JSON, not an object,
a field of the wrong type, a payload holding two values or a newline) are
found by bisection - only the failing halves are parsed again - and come
out as rejects: a null ``value``, the raw bytes in ``_corrupt_record`` and
the parser's message in ``_error``.  Nothing is dropped.
"""

from __future__ import annotations

import re
from array import array
from typing import Iterable, Iterator, Literal, Protocol, overload

import numpy as np
import pyarrow as pa
import pyarrow.json as pajson

from storage_c import Log, ReadBatch
from storage_c.records import NdjsonBatch

from ..lake.evolve import conform, grow, mismatch, no_object
from ..lake.layout import TIMESTAMP

META_FIELDS: list[pa.Field] = [
    pa.field("stream", pa.string()),
    pa.field("shard", pa.int32()),
    pa.field("entry", pa.int64()),
    pa.field("timestamp", TIMESTAMP),
]
RAW_SCHEMA = pa.schema(META_FIELDS + [pa.field("value", pa.binary())])
RAW_DDL = "stream string, shard int, entry long, timestamp timestamp, value binary"
NULL_HEAD = re.compile(rb"[ \t\r]*null")
"""A line that starts with the JSON value null: pyarrow's JSON reader (26)
crashes the process on one (a segmentation fault, not an error), so such a
line never reaches it."""
LINE_HEADS = np.array([ord(c) for c in "n \t\r"], dtype=np.uint8)
ROW_SUFFIX = re.compile(r" in row \d+$")
"""pyarrow's position of a parse error: row 0 of a one-entry parse says nothing."""
ERROR_FIELDS: list[pa.Field] = [pa.field("_error", pa.string()), pa.field("_corrupt_record", pa.binary())]


def parsed_schema(value_type: pa.StructType) -> pa.Schema:
    return pa.schema(META_FIELDS + [pa.field("value", value_type)] + ERROR_FIELDS)


def meta_columns(stream: str, shard: int, entries: pa.Array, timestamps_ns: np.ndarray) -> list[pa.Array]:
    n = len(entries)
    name = stream.encode()
    offsets = np.arange(0, (n + 1) * len(name), len(name) or 1, dtype=np.int32)[: n + 1] \
        if name else np.zeros(n + 1, dtype=np.int32)
    # The ignores: numpy's stubs give ndarray the buffer protocol on Python 3.12+ only.
    streams = pa.Array.from_buffers(pa.string(), n, [
        None, pa.py_buffer(offsets),  # type: ignore[arg-type]  # ndarray is a buffer
        pa.py_buffer(name * n)])
    shard_ids = np.full(n, shard, np.int32)
    shards = pa.Array.from_buffers(pa.int32(), n, [
        None, pa.py_buffer(shard_ids)])  # type: ignore[arg-type]  # ndarray is a buffer
    micros = timestamps_ns // 1000
    times = pa.Array.from_buffers(TIMESTAMP, n, [
        None, pa.py_buffer(micros)])  # type: ignore[arg-type]  # ndarray is a buffer
    return [streams, shards, entries, times]


def int64s(values: array) -> np.ndarray:
    return np.frombuffer(memoryview(values), dtype=np.int64)


def raw_batch(batch: ReadBatch) -> pa.RecordBatch:
    n = len(batch)
    entries = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(batch.entries)])
    values = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(batch.offsets),
                                                    pa.py_buffer(batch.data)])
    columns = meta_columns(batch.stream, batch.shard, entries, int64s(batch.timestamps))
    return pa.RecordBatch.from_arrays(columns + [values], schema=RAW_SCHEMA)


@overload
def read_range(log: Log, stream: str, shard: int, start: int, end: int, rows: int,
               max_bytes: int, newlines: Literal[False] = False) -> Iterator[ReadBatch]: ...
@overload
def read_range(log: Log, stream: str, shard: int, start: int, end: int, rows: int,
               max_bytes: int, newlines: Literal[True]) -> Iterator[NdjsonBatch]: ...
def read_range(log: Log, stream: str, shard: int, start: int, end: int, rows: int,
               max_bytes: int, newlines: bool = False) -> Iterator[ReadBatch | NdjsonBatch]:
    """Reads of at most ``rows`` entries from ``start`` up to ``end``
    (exclusive).  Entries deleted by retention are skipped by the reader
    (it counts them in the shard's stats)."""
    position = start
    read = log.read_ndjson if newlines else log.read
    while position < end:
        want = min(rows, end - position)
        # The reader fills an Arrow buffer that the batch then owns: no copy.
        # Pages of it that the read does not reach are never touched.
        got = read(stream, shard, position, want, max_bytes, into=pa.allocate_buffer(max_bytes))
        if not len(got.entries):
            return
        # A read may run past `end` only if entries were skipped; cut it there.
        yield got
        position = got.next_entry


def raw_batches(log: Log, stream: str, shard: int, start: int, end: int, rows: int,
                max_bytes: int) -> Iterator[pa.RecordBatch]:
    for got in read_range(log, stream, shard, start, end, rows, max_bytes):
        batch = raw_batch(got)
        yield _cut(batch, end)


def _cut(batch: pa.RecordBatch, end: int) -> pa.RecordBatch:
    entries = batch.column(2)
    if len(entries) and entries[-1].as_py() >= end:
        keep = int(np.searchsorted(entries.to_numpy(), end))
        return batch.slice(0, keep)
    return batch


# ---- parsed mode ------------------------------------------------------------------------

class JsonParser:
    """Parses newline-joined JSON objects against one value type.

    With ``evolve`` (``comet spark-ship`` without ``--schema``) the type
    grows: a field it lacks is inferred and added (``evolve.grow``), and a
    field not ``fixed`` (the table's columns; default: every field of
    ``value_type``) that is long and meets a fractional number becomes
    double; ``value_type`` is the type so far, every batch is built with it."""

    def __init__(self, value_type: pa.StructType, evolve: bool = False,
                 fixed: Iterable[str] | None = None) -> None:
        self.evolve = evolve
        self._base = set(fixed) if fixed is not None else {f.name for f in value_type}
        self._read = pajson.ReadOptions(use_threads=False, block_size=4 << 20)
        self._use(value_type)

    def _use(self, value_type: pa.StructType) -> None:
        self.value_type = value_type
        self.schema = parsed_schema(value_type)
        self._options = self._parse_options(value_type, False)
        self._one_options = self._parse_options(value_type, True)

    def _parse_options(self, value_type: pa.StructType, single: bool) -> pajson.ParseOptions:
        return pajson.ParseOptions(explicit_schema=pa.schema(list(value_type)),
                                   unexpected_field_behavior="infer" if self.evolve else "ignore",
                                   newlines_in_values=single)

    def _table(self, data: bytes | memoryview, options: pajson.ParseOptions) -> pa.Table:
        return pajson.read_json(pa.BufferReader(data),  # type: ignore[arg-type]  # any NativeFile
                                read_options=self._read, parse_options=options)

    def parse(self, data: bytes | memoryview, count: int, single: bool = False) -> pa.StructArray | str:
        """The values as one struct array, or why not (exactly ``count``
        objects are expected)."""
        if isinstance(data, bytes) and not data.strip():  # a view: the parser finds out
            return "empty payload" if count == 1 else "empty lines"
        if starts_with_null(data):
            return "a value is null, not a JSON object" if single else "a line is null"
        while True:
            try:
                table = self._table(data, self._one_options if single else self._options)
            except pa.ArrowInvalid as exc:
                if self.evolve and self._widen(data, single):
                    continue
                return ROW_SUFFIX.sub("", str(exc)) if single else str(exc)
            if table.num_rows != count:
                return (f"holds {table.num_rows} JSON values, not one" if single
                        else "value count differs from entry count")
            if self.evolve:
                grown = grow(self.value_type, table.schema)
                if grown != self.value_type:
                    self._use(grown)  # parsed again: text read as a timestamp stays text
                    continue
            break
        columns = [conform(table.column(f.name).combine_chunks(), f.type) for f in self.value_type]
        return pa.StructArray.from_arrays(columns, fields=list(self.value_type))

    def _widen(self, data: bytes | memoryview, single: bool) -> bool:
        """After a failed parse: whether long fields that are not fixed,
        read again as new, come out double (then they are double from now on)."""
        longs = {f.name for f in self.value_type if f.name not in self._base and f.type == pa.int64()}
        if not longs:
            return False
        trial = pa.struct([f for f in self.value_type if f.name not in longs])
        try:
            table = self._table(data, self._parse_options(trial, single))
        except pa.ArrowInvalid:
            return False
        doubles = {f.name for f in table.schema if f.name in longs and f.type == pa.float64()}
        if not doubles:
            return False
        self._use(pa.struct([f.with_type(pa.float64()) if f.name in doubles else f
                             for f in self.value_type]))
        return True

    def batch(self, got: NdjsonBatch, log: Log, max_bytes: int) -> pa.RecordBatch:
        """One NdjsonBatch as a parsed record batch (rejects included)."""
        n = len(got.entries)
        stream, shard = got.stream, got.shard
        entries = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(got.entries)])
        meta = meta_columns(stream, shard, entries, int64s(got.timestamps))
        parsed = None if got.newline_payloads else self.parse(got.data, n)
        if isinstance(parsed, pa.StructArray):
            nulls: list[pa.Array] = [pa.nulls(n, pa.string()), pa.nulls(n, pa.binary())]
            return pa.RecordBatch.from_arrays(meta + [parsed] + nulls, schema=self.schema)
        # Something in this batch does not parse: read it again with entry
        # bounds and find the culprits.
        return self._bisected(log.read(stream, shard, got.entries[0], n, max_bytes))

    def _bisected(self, raw: ReadBatch) -> pa.RecordBatch:
        n = len(raw)
        entries = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(raw.entries)])
        meta = meta_columns(raw.stream, raw.shard, entries, int64s(raw.timestamps))
        payloads = raw.payloads
        pieces: list[pa.StructArray] = []
        errors: list[str | None] = []
        corrupt: list[bytes | None] = []

        def solve(lo: int, hi: int) -> None:
            single = hi - lo == 1
            got = self.parse(b"\n".join(payloads[lo:hi]) + b"\n", hi - lo, single)
            if isinstance(got, pa.StructArray):
                pieces.append(got)
                errors.extend([None] * (hi - lo))
                corrupt.extend([None] * (hi - lo))
            elif single:
                pieces.append(pa.nulls(1, self.value_type))
                errors.append(no_object(payloads[lo]) or mismatch(payloads[lo], self.value_type) or got)
                corrupt.append(payloads[lo])
            else:
                mid = (lo + hi) // 2
                solve(lo, mid)
                solve(mid, hi)

        solve(0, len(payloads))
        # the type may have grown on the way: earlier pieces get its new fields, null
        value = pa.concat_arrays([conform(p, self.value_type) for p in pieces])
        return pa.RecordBatch.from_arrays(
            meta + [value, pa.array(errors, pa.string()), pa.array(corrupt, pa.binary())],
            schema=self.schema)


def starts_with_null(data: bytes | memoryview) -> bool:
    """Whether a line of ``data`` starts with null (NULL_HEAD).  A vector pass
    finds the lines that start with "n" or a blank (JSON objects start with
    "{"), and only those are looked at."""
    text = np.frombuffer(data, dtype=np.uint8)
    if not len(text):
        return False
    heads = np.concatenate(([0], np.flatnonzero(text[:-1] == ord("\n")) + 1))
    suspects = heads[np.isin(text[heads], LINE_HEADS)]
    return any(NULL_HEAD.match(data, int(at)) for at in suspects)


class BatchParser(Protocol):
    """What turns a read's NDJSON into a parsed record batch (``parsed_schema``
    of its ``value_type``, rejects included): ``JsonParser``, or
    ``otlp_rows.OtlpParser`` for the OTLP streams."""

    value_type: pa.StructType

    def batch(self, got: NdjsonBatch, log: Log, max_bytes: int) -> pa.RecordBatch: ...


def parsed_batches(log: Log, parser: BatchParser, stream: str, shard: int, start: int, end: int,
                   rows: int, max_bytes: int) -> Iterator[pa.RecordBatch]:
    for got in read_range(log, stream, shard, start, end, rows, max_bytes, newlines=True):
        yield _cut(parser.batch(got, log, max_bytes), end)
