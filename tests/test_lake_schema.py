"""How the lake's schema grows (spark_jobs/lake/evolve.py, the parser's evolve mode): no Spark."""

from __future__ import annotations

from typing import Any, cast

import pyarrow as pa

from spark_jobs.spark.arrow import JsonParser
from spark_jobs.lake.evolve import canonical, conform, fits, mismatch, normalize, resolve

LONG, DOUBLE, TEXT, BOOL = pa.int64(), pa.float64(), pa.string(), pa.bool_()


def values(array: Any) -> list[Any]:
    """The rows of a parsed struct array (the stubs type to_pylist for plain arrays only)."""
    assert isinstance(array, pa.StructArray), array
    rows: list[Any] = cast(Any, array).to_pylist()  # the stubs type it for plain arrays
    return rows


def struct(**fields: pa.DataType) -> pa.StructType:
    return pa.struct([pa.field(name, t) for name, t in fields.items()])


def test_new_fields_grow_the_type_as_spark_would_infer_them() -> None:
    parser = JsonParser(struct(a=LONG), evolve=True)
    got = parser.parse(b'{"a": 1, "t": "2026-11-27T10:00:00Z", "n": null, "g": {"x": 1}}\n'
                       b'{"a": 2, "b": 3, "hour": 5, "_comet_entry": 1}\n', 2)
    # timestamp-looking text stays text; only-null is left out; the table's own names too
    assert parser.value_type == struct(a=LONG, t=TEXT, g=struct(x=LONG), b=LONG)
    assert values(got) == [{"a": 1, "t": "2026-11-27T10:00:00Z", "g": {"x": 1}, "b": None},
                               {"a": 2, "t": None, "g": None, "b": 3}]
    # a field it added as long that meets 1.5 becomes double; a new child of g joins g
    got = parser.parse(b'{"a": 3, "b": 1.5, "g": {"x": 2, "y": true}}\n', 1)
    assert parser.value_type == struct(a=LONG, t=TEXT, g=struct(x=LONG, y=BOOL), b=DOUBLE)
    assert values(got)[0]["b"] == 1.5


def test_a_known_column_keeps_its_type_and_the_reject_says_which_field() -> None:
    parser = JsonParser(struct(a=LONG, temp=DOUBLE), evolve=True)
    assert isinstance(parser.parse(b'{"a": 1, "temp": 20}\n', 1), pa.StructArray)  # long into double
    assert parser.parse(b'{"a": "x"}\n', 1, single=True) == \
        "JSON parse error: Column(/a) changed from number to string"  # no "in row 0"
    assert mismatch(b'{"a": "x", "temp": "hot"}', parser.value_type) == (
        "field 'a' is string here, the lake's column is long; "
        "field 'temp' is string here, the lake's column is double")
    assert parser.value_type == struct(a=LONG, temp=DOUBLE)


def test_without_evolve_unknown_fields_are_ignored() -> None:
    parser = JsonParser(struct(a=LONG))
    got = parser.parse(b'{"a": 1, "b": 2}\n', 1)
    assert isinstance(got, pa.StructArray) and got.type == struct(a=LONG)


def test_resolve_widens_long_and_double_and_else_the_first_task_wins() -> None:
    table = struct(a=LONG, g=struct(x=LONG))
    seen = [struct(a=LONG, b=LONG, c=TEXT, g=struct(x=LONG, y=TEXT)),
            struct(a=LONG, b=DOUBLE, c=LONG)]
    run = resolve(table, seen)
    assert run == struct(a=LONG, g=struct(x=LONG, y=TEXT), b=DOUBLE, c=TEXT)
    assert fits(struct(a=LONG, g=struct(x=LONG)), run)  # written before g grew: nulls
    assert not fits(struct(b=LONG), run)  # written as long: the task runs again as double
    assert not fits(struct(c=LONG), run)


def test_conform_fills_missing_children_and_drops_extra_ones() -> None:
    old = pa.array([{"x": 1}, None], struct(x=LONG))
    out = conform(old, struct(x=LONG, y=TEXT))
    assert out.to_pylist() == [{"x": 1, "y": None}, None]
    wide = pa.array([{"x": 1, "z": None}], struct(x=LONG, z=pa.null()))
    assert conform(wide, struct(x=LONG)).to_pylist() == [{"x": 1}]
    lists = pa.array([[{"x": 1}], [], None], pa.list_(struct(x=LONG))).slice(1)
    assert conform(lists, pa.list_(struct(x=LONG, y=TEXT))).to_pylist() == [[], None]


def test_one_spelling_per_type() -> None:
    assert canonical(pa.large_list(pa.large_string())) == pa.list_(TEXT)
    assert canonical(pa.list_(pa.field("element", LONG))) == pa.list_(LONG)
    assert normalize(pa.timestamp("s")) == TEXT
    assert normalize(pa.null()) is None
    assert normalize(pa.list_(pa.null())) == pa.list_(TEXT)
