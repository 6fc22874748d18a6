"""The value schema of the ``comet`` source and of ``comet spark-ship``.

A schema is given as Spark DDL (``"device string, temp double"``) or as a
StructType's JSON.  Only Spark's own parser decides what is valid DDL: no
parser outside the JVM follows its grammar (sqlglot, measured, accepts
``a map<int>`` and ``a int,`` and refuses ``a struct<>``).  ``comet
spark-ship`` therefore checks a given schema on the driver's JVM before
anything starts a Python worker, and only once a run has work to do.

Without one, ``comet spark-ship`` starts from the lake's columns and lets
pyarrow's JSON reader find the fields they lack, first in a sample of the
run's entries (here, on the driver), then in the tasks (``lake/evolve.py``).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Mapping, cast

import pyarrow as pa

from storage_c import Log

from ..lake.evolve import PARTITION_NAMES, RESERVED_PREFIX, canonical, reserved

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

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


def given_value_type(ddl: str) -> pa.StructType:
    """A given schema (DDL) as the Arrow type the lake stores (needs the
    session's JVM, for Spark's parser)."""
    from pyspark.sql.pandas.types import to_arrow_type

    return cast(pa.StructType, canonical(to_arrow_type(struct_of(ddl), timezone="UTC")))


def check_value_type(value_type: pa.StructType, event_time_field: str | None) -> None:
    """Valid for the lake: no name of the table's own columns, and the event
    time field (if any) in it as a timestamp or a number."""
    for f in value_type:
        if reserved(f.name):
            raise ValueError(f"value field {f.name!r}: names starting with {RESERVED_PREFIX} and "
                             f"{', '.join(PARTITION_NAMES)} are the lake's own columns")
    if not event_time_field:
        return
    names = [f.name for f in value_type]
    if event_time_field not in names:
        raise ValueError(f"event time field {event_time_field!r} is not in the value "
                         f"schema ({', '.join(names) or 'no fields'})")
    kind = value_type.field(event_time_field).type
    if not (pa.types.is_timestamp(kind) or pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        raise ValueError(f"event time field {event_time_field!r} is {kind}: give it as timestamp "
                         "(ISO 8601 text) or a number (epoch, see --event-time-unit) in the schema")


def sample_value_type(storage: Log, stream: str, starts: Mapping[int, int], ends: Mapping[int, int],
                      sample: int, known: pa.StructType) -> pa.StructType:
    """``known`` grown by the fields of up to ``sample`` entries spread over
    the shards (those that do not parse are left for the run's rejects)."""
    from .arrow import JsonParser

    parser = JsonParser(known, evolve=True)
    live = [s for s in starts if starts[s] < ends[s]]
    per_shard = max(1, sample // max(1, len(live)))
    payloads: list[bytes] = []
    for shard in live:
        got = storage.read(stream, shard, starts[shard], min(per_shard, ends[shard] - starts[shard]))
        payloads.extend(p for p in got.payloads if p.lstrip().startswith(b"{"))
    if payloads and isinstance(parser.parse(b"\n".join(payloads) + b"\n", len(payloads)), str):
        for payload in payloads:  # something in the sample does not parse: one by one
            parser.parse(payload + b"\n", 1, single=True)
    return parser.value_type
