"""The value schema of the ``comet`` source and of ``comet spark-ship``.

A schema is given as Spark DDL (``"device string, temp double"``) or as a
StructType's JSON, or inferred by Spark from a sample of the stream.  Only
Spark's own parser decides what is valid DDL: no parser outside the JVM
follows its grammar (sqlglot, measured, accepts ``a map<int>`` and ``a int,``
and refuses ``a struct<>``).  ``comet spark-ship`` therefore checks a schema
on the driver's JVM before anything starts a Python worker, and only once a
run has work to do.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Mapping

from storage_c import Log

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

RESERVED_PREFIX = "_comet_"
"""Names of the lake's own columns; no value field may start with it."""


def value_ddl(text: str) -> str:
    """The value schema as DDL for ``struct<...>``: given as DDL, or as a
    StructType's JSON (pyspark reads that without a JVM)."""
    text = text.strip()
    if not text.startswith("{"):
        return text
    from pyspark.sql.types import StructType

    try:
        struct = StructType.fromJson(json.loads(text))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"value schema is not a StructType's JSON: {exc}") from None
    return ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in struct.fields)


def struct_of(ddl: str) -> StructType:
    """Spark's parse of ``ddl`` (needs the session's JVM), or a one-line
    ValueError with Spark's reason."""
    from pyspark.sql.types import DataType, StructType

    try:
        parsed = DataType.fromDDL(ddl)
    except Exception as exc:
        raise ValueError(f"value schema {ddl!r} is not valid Spark DDL: {spark_reason(exc)}") from None
    if not isinstance(parsed, StructType):
        raise ValueError(f"value schema {ddl!r}: give fields, like 'device string, temp double'")
    return parsed


def spark_reason(exc: BaseException) -> str:
    """Spark's own message in one line: a ParseException's text starts with
    an empty line and goes on with the DDL and a caret under the fault; a
    Py4J error carries the JVM's stack trace.  The first line with words is
    the reason (``[PARSE_SYNTAX_ERROR] Syntax error at or near 'g'. SQLSTATE:
    42601 (line 1, pos 7)``)."""
    for line in str(exc).splitlines():
        line = line.strip()
        if line:
            return line
    return type(exc).__name__


def check_schema(ddl: str, event_time_field: str | None) -> StructType:
    """The parsed schema, once it is valid for the lake: no reserved names,
    and the event time field (if any) in it as a timestamp or a number."""
    from pyspark.sql.types import NumericType, TimestampType

    struct = struct_of(ddl)
    for f in struct.fields:
        if f.name.startswith(RESERVED_PREFIX):
            raise ValueError(f"value field {f.name!r}: names starting with {RESERVED_PREFIX} "
                             "are the lake's own columns")
    if event_time_field:
        if event_time_field not in struct.fieldNames():
            raise ValueError(f"event time field {event_time_field!r} is not in the value "
                             f"schema ({', '.join(struct.fieldNames())})")
        kind = struct[event_time_field].dataType
        if not isinstance(kind, (TimestampType, NumericType)):
            raise ValueError(f"event time field {event_time_field!r} is {kind.simpleString()}: "
                             "give it as timestamp (ISO 8601 text) or a number "
                             "(epoch, see --event-time-unit) in the schema")
    return struct


def infer_schema(spark: Any, storage: Log, stream: str, starts: Mapping[int, int],
                 ends: Mapping[int, int], sample: int) -> str:
    """Spark's JSON inference over up to ``sample`` entries, spread over shards."""
    import orjson

    lines: list[str] = []
    live = [s for s in starts if starts[s] < ends[s]]
    per_shard = max(1, sample // max(1, len(live)))
    for shard in live:
        got = storage.read(stream, shard, starts[shard], min(per_shard, ends[shard] - starts[shard]))
        for payload in got.payloads:
            try:
                if isinstance(orjson.loads(payload), dict):
                    lines.append(payload.decode("utf-8", "replace"))
            except orjson.JSONDecodeError:
                continue
    if not lines:
        raise ValueError(f"cannot infer a schema: no JSON object among the first entries of "
                         f"{stream!r}; give one with --schema")
    inferred = spark.read.json(spark.sparkContext.parallelize(lines, 1)).schema
    fields = [f for f in inferred.fields if f.name != "_corrupt_record"]
    return ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in fields)
