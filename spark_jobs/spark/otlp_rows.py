"""OTLP events as rows of their built-in schema (``otlp_schema.py``).

pyarrow's JSON reader cannot read these events: attribute maps hold values
of any JSON type, doubles may be the strings ``"NaN"``, ``"Infinity"``,
``"-Infinity"``, and a repeated attribute key is "specified twice" to it.
So a task of an OTLP stream reads each event with orjson (a repeated key:
the last one wins, as in Spark with ``spark.sql.mapKeyDedupPolicy=LAST_WIN``)
and converts it by the rules the schema's types and names call for:

- ``map<string,string>`` and ``string``: a JSON string as itself, null as
  null, any other value as its JSON text (compact) - what Spark's JSON
  reader does for a string column;
- ``double``: a number, or one of the three strings above;
- ``int``, ``long``: an integer in the column's range; a uint64 beyond a
  long's (above 2^63-1) cannot be stored, and its entry is a reject that
  says which field: the rejects table keeps its bytes, nothing is lost;
- the derived columns (``DERIVED``), computed from their sibling;
- a field the schema lacks is left out, one the event lacks is null.

An entry that is not a JSON object, or whose value does not fit, is a
reject with the reason (``arrow.JsonParser``'s layout of a batch).
"""

from __future__ import annotations

import gc
from typing import Any, Callable, cast

import orjson
import pyarrow as pa

from storage_c import Log
from storage_c.records import NdjsonBatch

from .arrow import ERROR_FIELDS, int64s, meta_columns, parsed_schema
from ..lake.evolve import json_type, type_name

Convert = Callable[[Any], Any]
"""One field's conversion: the event's object in, the field's row value out."""

NON_FINITE = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}
CHUNK_ROWS = 2048
"""Events converted to Python objects at a time (their memory: a few MiB)."""
LONG_MAX = (1 << 63) - 1
INT_MAX = (1 << 31) - 1


def _ns_timestamp(ns: Any) -> Any:
    """Nanoseconds since the epoch as the lake's timestamp (microseconds); 0 (unset): null."""
    return ns // 1000 if type(ns) is int and ns else None


def _duration(obj: dict[str, Any]) -> Any:
    start, end = obj.get("start_time_unix_nano"), obj.get("end_time_unix_nano")
    return end - start if type(start) is int and type(end) is int and start and end else None


def _as_int(value: Any) -> Any:
    return value if type(value) is int else None


DERIVED: dict[str, tuple[tuple[str, ...], Convert]] = {
    "duration_ns": (("start_time_unix_nano", "end_time_unix_nano"), _duration),
    "as_int": (("value",), _as_int),
}
"""Columns computed from their siblings, by name: the siblings they need,
and the conversion (of the sibling's value; of the whole object when it
needs several).  Besides these, a timestamp ``X`` beside ``X_unix_nano``."""


class Unfit(ValueError):
    """A value does not fit its column."""


def _text(value: Any) -> Any:
    if type(value) is str or value is None:
        return value
    return orjson.dumps(value).decode()


def _double(value: Any) -> Any:
    kind = type(value)
    if kind is float or value is None:
        return value
    if kind is int:
        return float(value)
    if kind is str and value in NON_FINITE:
        return NON_FINITE[value]
    raise Unfit(value)


def _map(value: Any) -> Any:
    if value is None:
        return None
    if type(value) is not dict:
        raise Unfit(value)
    return {k: v if type(v) is str or v is None else orjson.dumps(v).decode() for k, v in value.items()}


def compile_struct(t: pa.StructType) -> Convert:
    """The conversion of an object into a row of ``t``: one generated
    function per struct type, fields that stay as they are read inline
    (a call per field would cost more than the rest of the conversion)."""
    namespace: dict[str, Any] = {"Unfit": Unfit, "_text": _text, "_double": _double, "_map": _map,
                                 "_ns_timestamp": _ns_timestamp, "dict": dict, "list": list,
                                 "str": str, "float": float}
    lines: list[str] = []
    top = _struct_function(t, namespace, lines)
    exec("\n".join(lines), namespace)  # noqa: S102 - names are quoted with repr()
    return cast(Convert, namespace[top])


def _struct_function(t: pa.StructType, namespace: dict[str, Any], lines: list[str]) -> str:
    name = f"_struct{len(namespace)}"
    namespace[name] = None  # the name is taken
    names = {f.name for f in t}
    items = []
    for f in t:
        if f.name in DERIVED and set(DERIVED[f.name][0]) <= names:
            sources, fn = DERIVED[f.name]
            namespace[f"_derived_{f.name}"] = fn
            arg = "o" if len(sources) > 1 else f"g({sources[0]!r})"
            expr = f"_derived_{f.name}({arg})"
        elif pa.types.is_timestamp(f.type) and f"{f.name}_unix_nano" in names:
            expr = f"_ns_timestamp(g({f.name + '_unix_nano'!r}))"
        else:
            expr = _expression(f.type, f"g({f.name!r})", namespace, lines)
        items.append(f"{f.name!r}: {expr}")
    lines += [f"def {name}(o):",
              "    if o is None: return None",
              "    if type(o) is not dict: raise Unfit(o)",
              "    g = o.get",
              "    return {" + ", ".join(items) + "}"]
    return name


def _expression(t: pa.DataType, value: str, namespace: dict[str, Any], lines: list[str]) -> str:
    """Python source of the conversion of ``value`` (source too) to a value of ``t``."""
    if pa.types.is_map(t):
        return f"_map({value})"
    if pa.types.is_string(t):
        return f"(v if type(v := {value}) is str or v is None else _text(v))"
    if pa.types.is_floating(t):
        return f"(v if type(v := {value}) is float or v is None else _double(v))"
    if pa.types.is_struct(t):
        return f"{_struct_function(t, namespace, lines)}({value})"
    if pa.types.is_list(t):
        item = _expression(t.value_type, "x", namespace, lines)
        if item == "x":
            return value  # pyarrow checks the items
        name = f"_list{len(namespace)}"
        namespace[name] = None
        lines += [f"def {name}(items):",
                  "    if items is None: return None",
                  "    if type(items) is not list: raise Unfit(items)",
                  f"    return [{item} for x in items]"]
        return f"{name}({value})"
    return value  # int, long, boolean: pyarrow checks them


def why_unfit(value: Any, t: pa.DataType, path: str = "") -> str | None:
    """What in an event does not fit ``t`` (None: nothing found): the first
    field whose value does not, by its dotted path."""
    if value is None:
        return None
    where = f"field {path[1:]!r}" if path else "the value"
    if pa.types.is_struct(t):
        if type(value) is not dict:
            return f"{where} is {json_type(value)}, not an object"
        for f in t:
            if f.name not in value:
                continue
            problem = why_unfit(value[f.name], f.type, f"{path}.{f.name}")
            if problem:
                return problem
        return None
    if pa.types.is_list(t):
        if type(value) is not list:
            return f"{where} is {json_type(value)}, the lake's column is {type_name(t)}"
        for i, v in enumerate(value):
            problem = why_unfit(v, t.value_type, f"{path}[{i}]")
            if problem:
                return problem
        return None
    if pa.types.is_map(t):
        ok = type(value) is dict
    elif pa.types.is_string(t):
        ok = True
    elif pa.types.is_floating(t):
        ok = type(value) in (int, float) or value in NON_FINITE
    elif pa.types.is_boolean(t):
        ok = type(value) is bool
    elif pa.types.is_integer(t):
        if type(value) is int:
            top = LONG_MAX if t == pa.int64() else INT_MAX
            if not -top - 1 <= value <= top:
                return (f"{where} is {value}, beyond the range of the lake's {type_name(t)} "
                        f"column ({-top - 1} to {top})")
        ok = type(value) is int
    else:
        ok = True
    if ok:
        return None
    return f"{where} is {json_type(value)} here, the lake's column is {type_name(t)}"


class OtlpParser:
    """The parser of an OTLP stream's task (``writer.ShipTask``): batches
    of events in, record batches of rows (and rejects) out, as
    ``arrow.JsonParser.batch`` gives them."""

    def __init__(self, value_type: pa.StructType) -> None:
        self.value_type = value_type
        self.schema = parsed_schema(value_type)
        self._convert = compile_struct(value_type)

    def rows(self, payloads: list[bytes]) -> tuple[pa.StructArray, list[str | None]]:
        """The payloads' rows (null for a reject) and each one's reason to be a reject."""
        arrays: list[pa.Array] = []
        errors: list[str | None] = []
        for start in range(0, len(payloads), CHUNK_ROWS):
            array, chunk_errors = self._chunk(payloads[start:start + CHUNK_ROWS])
            arrays.append(array)
            errors += chunk_errors
        if not arrays:
            return self._array([]), errors
        return cast(pa.StructArray, pa.concat_arrays(arrays)), errors

    def _chunk(self, payloads: list[bytes]) -> tuple[pa.StructArray, list[str | None]]:
        rows: list[Any] = []
        errors: list[str | None] = []
        # Every event is a tree of new objects, all alive until the chunk is
        # built: the cyclic collector would scan them again and again
        # (measured: half the time) and finds no cycles in JSON.
        collecting = gc.isenabled()
        gc.disable()
        try:
            for payload in payloads:
                row, error = self._row(payload)
                rows.append(row)
                errors.append(error)
        finally:
            if collecting:
                gc.enable()
        try:
            return self._array(rows), errors
        except (pa.ArrowException, OverflowError, TypeError, ValueError):
            pass
        # a value pyarrow refused (an integer out of range, say): find whose, one by one
        for i, row in enumerate(rows):
            if row is not None:
                try:
                    pa.array([row], self.value_type)
                except (pa.ArrowException, OverflowError, TypeError, ValueError) as exc:
                    rows[i] = None
                    errors[i] = why_unfit(orjson.loads(payloads[i]), self.value_type) or str(exc)
        return self._array(rows), errors

    def _array(self, rows: list[Any]) -> pa.StructArray:
        return cast(pa.StructArray, pa.array(rows, self.value_type))

    def _row(self, payload: bytes) -> tuple[Any, str | None]:
        if not payload.strip():
            return None, "empty payload"
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            return None, f"not JSON: {exc}"
        if type(event) is not dict:
            return None, f"not a JSON object but {json_type(event)}"
        try:
            return self._convert(event), None
        except Unfit as exc:
            return None, why_unfit(event, self.value_type) or f"a value does not fit: {exc}"

    def batch(self, got: NdjsonBatch, log: Log, max_bytes: int) -> pa.RecordBatch:
        n = len(got.entries)
        entries = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(got.entries)])
        meta = meta_columns(got.stream, got.shard, entries, int64s(got.timestamps))
        if got.newline_payloads:  # payloads with newlines: read again with entry bounds
            payloads = log.read(got.stream, got.shard, got.entries[0], n, max_bytes).payloads
        else:
            payloads = bytes(got.data).split(b"\n")[:n]
        values, errors = self.rows(payloads)
        corrupt = [None if e is None else p for p, e in zip(payloads, errors)]
        return pa.RecordBatch.from_arrays(
            meta + [values, pa.array(errors, ERROR_FIELDS[0].type), pa.array(corrupt, pa.binary())],
            schema=self.schema)
