"""The built-in value schemas of the OTLP streams (``comet spark-ship`` without ``--schema``).

The gateway stores each OTLP log record, span and metric data point as one
JSON event (docs/opentelemetry.md; the reference: tests/support/otlp.py)
in the streams ``otel-logs``, ``otel-traces`` and ``otel-metrics``.  Their
lake columns are declared here once, as Spark DDL: the docs show this text,
and Spark's parser reads it as this module does (tests/test_spark_ship.py).
How an event becomes a row: ``otlp_rows.py``.

The columns follow the event, nested as it is, plus columns derived from a
sibling (``otlp_rows.DERIVED``): beside every ``X_unix_nano`` (exact, long)
a timestamp ``X`` (UTC, microseconds; null for 0); ``duration_ns`` (end -
start) in spans; ``as_int`` (the exact integer of an integer point) beside
a metric point's or exemplar's ``value`` (double).  Attributes are
``map<string,string>`` (a string as itself, any other JSON value as its
JSON text), as are ``value_types``.  An int32 or enum of the protocol is an
``int``; every other integer (uint32, fixed32, int64, uint64, fixed64) a
``long``.  The three schemas agree on every column name they share, so the
streams can be shipped into one lake.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from storage_c.otlp import SIGNALS, STREAM_SIGNALS

if TYPE_CHECKING:
    import pyarrow as pa

ATTRIBUTES = "map<string, string>"
RESOURCE = ("struct<attributes: map<string, string>, dropped_attributes_count: long, "
            "entity_refs: array<struct<schema_url: string, type: string, id_keys: array<string>, "
            "description_keys: array<string>>>, schema_url: string>")
SCOPE = ("struct<name: string, version: string, attributes: map<string, string>, "
         "dropped_attributes_count: long, schema_url: string>")
BUCKETS = "struct<offset: int, bucket_counts: array<long>>"

DDL: dict[str, str] = {
    "logs": f"""
        resource {RESOURCE},
        scope {SCOPE},
        time_unix_nano long, time timestamp,
        observed_time_unix_nano long, observed_time timestamp,
        severity_number int, severity_text string,
        body string,
        attributes {ATTRIBUTES}, dropped_attributes_count long,
        flags long, trace_id string, span_id string, event_name string,
        value_types {ATTRIBUTES}""",
    "traces": f"""
        resource {RESOURCE},
        scope {SCOPE},
        trace_id string, span_id string, trace_state string, parent_span_id string,
        flags long, name string, kind int,
        start_time_unix_nano long, start_time timestamp,
        end_time_unix_nano long, end_time timestamp,
        duration_ns long,
        attributes {ATTRIBUTES}, dropped_attributes_count long,
        events array<struct<time_unix_nano: long, time: timestamp, name: string,
                            attributes: {ATTRIBUTES}, dropped_attributes_count: long>>,
        dropped_events_count long,
        links array<struct<trace_id: string, span_id: string, trace_state: string,
                           attributes: {ATTRIBUTES}, dropped_attributes_count: long, flags: long>>,
        dropped_links_count long,
        status struct<code: int, message: string>,
        value_types {ATTRIBUTES}""",
    "metrics": f"""
        resource {RESOURCE},
        scope {SCOPE},
        metric struct<name: string, description: string, unit: string, type: string,
                      aggregation_temporality: int, is_monotonic: boolean,
                      metadata: {ATTRIBUTES}>,
        attributes {ATTRIBUTES},
        start_time_unix_nano long, start_time timestamp,
        time_unix_nano long, time timestamp,
        flags long,
        value double, as_int long,
        count long, sum double,
        bucket_counts array<long>, explicit_bounds array<double>,
        scale int, zero_count long, zero_threshold double,
        positive {BUCKETS}, negative {BUCKETS},
        quantile_values array<struct<quantile: double, value: double>>,
        min double, max double,
        exemplars array<struct<filtered_attributes: {ATTRIBUTES}, time_unix_nano: long,
                               time: timestamp, value: double, as_int: long,
                               span_id: string, trace_id: string>>,
        value_types {ATTRIBUTES}""",
}


def ddl(signal: str) -> str:
    """The schema of ``signal`` as one line of Spark DDL (what ``--schema`` takes)."""
    return " ".join(DDL[check_signal(signal)].split())


def check_signal(signal: str) -> str:
    if signal not in SIGNALS:
        raise ValueError(f"OTLP signal {signal!r}: use one of {', '.join(SIGNALS)}")
    return signal


def signal_of(stream: str, otlp: str | None, value_schema: str | None) -> str | None:
    """The OTLP signal whose schema a run ships with (None: none): ``otlp``
    if given, else the one of the gateway's default stream names; a given
    value schema wins over a stream's name, not over an explicit ``otlp``."""
    if otlp is not None:
        if value_schema:
            raise ValueError("give a value schema or an OTLP signal, not both")
        return check_signal(otlp)
    return None if value_schema else STREAM_SIGNALS.get(stream)


def value_type(signal: str) -> pa.StructType:
    """The schema of ``signal`` as the Arrow type the lake stores."""
    import pyarrow as pa

    fields = _Parser(ddl(signal)).fields(end="")
    return pa.struct(fields)


# ---- the DDL's types, read without Spark ----------------------------------------------------

_TOKEN = re.compile(r"\s*(?:([A-Za-z_][A-Za-z0-9_]*)|(.))")


class _Parser:
    """Reads the subset of Spark DDL the schemas above use: fields ``name
    type`` (``name: type`` inside ``struct<>``) of string, int, long,
    double, boolean, timestamp, array, map and struct."""

    def __init__(self, text: str) -> None:
        self.tokens = [m.group(1) or m.group(2) for m in _TOKEN.finditer(text) if m.group(0).strip()]
        self.at = 0

    def take(self, expected: str | None = None) -> str:
        token = self.tokens[self.at] if self.at < len(self.tokens) else ""
        if expected is not None and token != expected:
            raise ValueError(f"DDL: {expected!r} expected, not {token!r}")
        self.at += 1
        return token

    def peek(self) -> str:
        return self.tokens[self.at] if self.at < len(self.tokens) else ""

    def fields(self, end: str) -> list[pa.Field]:
        import pyarrow as pa

        out = []
        while True:
            name = self.take()
            if self.peek() == ":":
                self.take()
            out.append(pa.field(name, self.type()))
            if self.peek() != ",":
                break
            self.take()
        self.take(end)
        return out

    def type(self) -> pa.DataType:
        import pyarrow as pa

        from ..lake.layout import TIMESTAMP

        name = self.take().lower()
        plain: dict[str, pa.DataType] = {"string": pa.string(), "int": pa.int32(), "long": pa.int64(), "bigint": pa.int64(),
                 "double": pa.float64(), "boolean": pa.bool_(), "timestamp": TIMESTAMP}
        if name in plain:
            return plain[name]
        self.take("<")
        if name == "array":
            out: pa.DataType = pa.list_(self.type())
        elif name == "map":
            key = self.type()
            self.take(",")
            out = pa.map_(key, self.type())
        elif name == "struct":
            return pa.struct(self.fields(end=">"))
        else:
            raise ValueError(f"DDL: type {name!r} is not one the OTLP schemas use")
        self.take(">")
        return out
