"""How the lake's schema grows with the data, without Spark.

A run parses its values against the schema it knows (the table's columns,
or ``--schema``).  Without ``--schema``, a field the schema does not have is
inferred by pyarrow's JSON reader and becomes a new nullable column:

- its type is what the first values say, normalized to what Spark's JSON
  inference gives: integers ``long``, other numbers ``double``, ``boolean``,
  ``string`` (text that looks like a timestamp too: Spark does not guess
  timestamps either), arrays and objects (``struct``) of those; a field only
  ever null is left out until a value says what it is;
- a new field inside a known object is a new field of that struct;
- a top-level field named like one of the table's own columns (``stream``,
  ``dt``, ``hour``, ``_comet_...``) is not stored;
- within a run, a new field seen as ``long`` in one place and ``double`` in
  another is ``double``; any other disagreement is settled by the first
  task (shard order) that saw the field;
- once a column exists its type is fixed: an entry whose value has another
  type goes to the rejects table with the reason (``long`` values are
  accepted into a ``double`` column: JSON has one kind of number).

``grow`` is the parser's step (what a parse saw, merged into what is known),
``resolve`` the driver's (the types the tasks fixed, merged into one schema).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, cast

import orjson
import pyarrow as pa
import pyarrow.json as pajson

RESERVED_PREFIX = "_comet_"
"""The lake's own columns start with it; no value field may."""
PARTITION_NAMES = ("stream", "dt", "hour")
"""The table's partition columns: no value field may be named so either."""


def reserved(name: str) -> bool:
    """A name of the table's own columns: a value field of that name is not
    stored (inferred: left out; given in ``--schema``: an error)."""
    return name.startswith(RESERVED_PREFIX) or name in PARTITION_NAMES


def normalize(t: pa.DataType) -> pa.DataType | None:
    """The type a new column gets for values pyarrow inferred as ``t``;
    None: nothing is known yet (only nulls)."""
    if pa.types.is_null(t):
        return None
    if pa.types.is_integer(t):
        return pa.int64()
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        return pa.float64()
    if pa.types.is_boolean(t):
        return pa.bool_()
    if pa.types.is_struct(t):
        fields = [pa.field(f.name, child) for f in t
                  if (child := normalize(f.type)) is not None]
        return pa.struct(fields) if fields else None
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        item = normalize(t.value_type)
        return pa.list_(item if item is not None else pa.string())
    return pa.string()  # text, and text pyarrow read as a timestamp


def grow(known: pa.StructType, seen: pa.Schema, top: bool = True) -> pa.StructType:
    """``known`` plus the fields a parse with it saw that it lacks (at any
    depth of objects; at the top, not the names of the table's own
    columns); known fields keep their types."""
    by_name = {f.name: f for f in seen}
    fields = []
    for f in known:
        other = by_name.get(f.name)
        fields.append(f.with_type(_grow_type(f.type, other.type)) if other is not None else f)
    names = {f.name for f in known}
    for f in seen:
        if f.name not in names and not (top and reserved(f.name)) and (t := normalize(f.type)) is not None:
            fields.append(pa.field(f.name, t))
    return pa.struct(fields)


def _grow_type(known: pa.DataType, seen: pa.DataType) -> pa.DataType:
    if pa.types.is_struct(known) and pa.types.is_struct(seen):
        return grow(known, pa.schema(list(seen)), top=False)
    if pa.types.is_list(known) and pa.types.is_list(seen):
        return pa.list_(_grow_type(known.value_type, seen.value_type))
    return known


def new_fields(base: pa.StructType, grown: pa.StructType) -> list[pa.Field]:
    """Top-level fields of ``grown`` not in ``base``, and those of ``base``
    whose struct type grew (as their grown field)."""
    names = {f.name: f.type for f in base}
    return [f for f in grown if f.name not in names or names[f.name] != f.type]


def widen(a: pa.DataType, b: pa.DataType, numbers: bool = True) -> pa.DataType | None:
    """One type for values seen as ``a`` in one place and ``b`` in another
    (struct children in ``a``'s order, then ``b``'s new ones; with
    ``numbers``, long and double are double); None: they disagree."""
    if a == b:
        return a
    if numbers and {a, b} == {pa.int64(), pa.float64()}:
        return pa.float64()
    if pa.types.is_struct(a) and pa.types.is_struct(b):
        children = {f.name: f.type for f in a}
        for f in b:
            if f.name in children:
                both = widen(children[f.name], f.type, numbers)
                if both is None:
                    return None
                children[f.name] = both
            else:
                children[f.name] = f.type
        return pa.struct([pa.field(n, t) for n, t in children.items()])
    if pa.types.is_list(a) and pa.types.is_list(b):
        item = widen(a.value_type, b.value_type, numbers)
        return pa.list_(item) if item is not None else None
    return None


def resolve(table: pa.StructType, seen: Iterable[pa.StructType]) -> pa.StructType:
    """The run's schema: ``table`` (types fixed), then every new field the
    tasks saw (``seen`` in task order), widened where they met it as long and
    double, else as the first task saw it."""
    fixed = {f.name for f in table}
    out: dict[str, pa.DataType] = {f.name: f.type for f in table}
    for struct in seen:
        for f in struct:
            if f.name in fixed:
                if pa.types.is_struct(out[f.name]) and pa.types.is_struct(f.type):
                    out[f.name] = _extend(cast(pa.StructType, out[f.name]), f.type)
                continue
            if f.name not in out:
                out[f.name] = f.type
            else:
                both = widen(out[f.name], f.type)
                if both is not None:
                    out[f.name] = both
    return pa.struct([pa.field(n, t) for n, t in out.items()])


def _extend(known: pa.StructType, seen: pa.StructType) -> pa.StructType:
    """A fixed struct column with the children ``seen`` adds (existing ones keep their types)."""
    children = {f.name: f.type for f in known}
    for f in seen:
        if f.name not in children:
            children[f.name] = f.type
        elif pa.types.is_struct(children[f.name]) and pa.types.is_struct(f.type):
            children[f.name] = _extend(children[f.name], f.type)
    return pa.struct([pa.field(n, t) for n, t in children.items()])


def fits(written: pa.StructType, schema: pa.StructType) -> bool:
    """Whether a file written with value type ``written`` belongs under
    ``schema`` as it is: each of its fields has the schema's type, or a
    struct type the schema's extends (a reader fills the missing children
    with nulls)."""
    types = {f.name: f.type for f in schema}
    return all(f.name in types and _fits(f.type, types[f.name]) for f in written)


def _fits(written: pa.DataType, target: pa.DataType) -> bool:
    if pa.types.is_struct(written) and pa.types.is_struct(target):
        return fits(written, target)
    if pa.types.is_list(written) and pa.types.is_list(target):
        return _fits(written.value_type, target.value_type)
    return written == target


def conform(array: pa.Array, to: pa.DataType) -> pa.Array:
    """``array`` as type ``to``: struct children picked by name, those it
    lacks all null (parsed before the type grew), those it has beyond ``to``
    left out; longs as doubles (parsed before the field widened)."""
    if array.type == to:
        return array
    if pa.types.is_struct(to) and pa.types.is_struct(array.type):
        have = dict(zip((f.name for f in array.type), array.flatten()))  # type: ignore[attr-defined]  # a StructArray
        children = [conform(have[f.name], f.type) if f.name in have else pa.nulls(len(array), f.type)
                    for f in to]
        return pa.StructArray.from_arrays(children, fields=list(to), mask=array.is_null())
    if pa.types.is_list(to) and pa.types.is_list(array.type):
        import pyarrow.compute as pc

        # flatten(): the values of this slice's non-null lists, in order
        values = conform(array.flatten(), to.value_type)  # type: ignore[attr-defined]  # a ListArray
        lengths = pc.fill_null(pc.list_value_length(array), 0).cast(pa.int32())
        offsets = pa.concat_arrays([pa.array([0], pa.int32()), pc.cumulative_sum(lengths)])
        return pa.ListArray.from_arrays(offsets, values, type=to, mask=array.is_null())
    if pa.types.is_integer(array.type) and pa.types.is_floating(to):
        return array.cast(to)  # parsed as long before the field became double
    return array


def json_type(value: Any) -> str:
    """What a parsed JSON value is, as a reject's error says it."""
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string",
            list: "an array", dict: "an object"}.get(type(value), type(value).__name__)


def no_object(payload: bytes) -> str | None:
    """Why one entry is no JSON object (None: it is one): not JSON (two values
    in one entry included), or JSON of another kind."""
    try:
        value = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        return f"not JSON: {exc}"
    if type(value) is not dict:
        return f"not a JSON object but {json_type(value)}"
    return None


def mismatch(payload: bytes, known: pa.StructType) -> str | None:
    """Why one JSON object does not fit ``known``, field by field (None:
    it is not an object, or no field says)."""
    try:
        table = pajson.read_json(pa.BufferReader(payload + b"\n"),  # type: ignore[arg-type]  # any NativeFile
                                 parse_options=pajson.ParseOptions(newlines_in_values=True))
    except pa.ArrowInvalid:
        return None
    types = {f.name: f.type for f in known}
    out = []
    for f in table.schema:
        have = normalize(f.type)
        want = types.get(f.name)
        if want is None or have is None or _accepts(want, have):
            continue
        out.append(f"field {f.name!r} is {type_name(have)} here, the lake's column is "
                   f"{type_name(want)}")
    return "; ".join(out) or None


def _accepts(want: pa.DataType, have: pa.DataType) -> bool:
    if want == have or (want == pa.float64() and have == pa.int64()):
        return True
    if pa.types.is_struct(want) and pa.types.is_struct(have):
        inner = {f.name: f.type for f in want}
        return all(f.name not in inner or _accepts(inner[f.name], f.type) for f in have)
    if pa.types.is_list(want) and pa.types.is_list(have):
        return _accepts(want.value_type, have.value_type)
    # text into a timestamp or date column: the parser's own message says more
    return pa.types.is_string(have) and (pa.types.is_timestamp(want) or pa.types.is_date(want))


_TYPE_NAMES: list[tuple[Callable[[pa.DataType], bool], str]] = [(pa.types.is_int64, "long"), (pa.types.is_integer, "int"),
               (pa.types.is_float64, "double"), (pa.types.is_floating, "float"),
               (pa.types.is_boolean, "boolean"), (pa.types.is_string, "string"),
               (pa.types.is_timestamp, "timestamp"), (pa.types.is_date, "date"),
               (pa.types.is_binary, "binary")]


def type_name(t: pa.DataType) -> str:
    """The type as Spark and Delta name it in messages."""
    if pa.types.is_struct(t):
        return "struct<" + ", ".join(f"{f.name} {type_name(f.type)}" for f in t) + ">"
    if pa.types.is_list(t):
        return f"array<{type_name(t.value_type)}>"
    if pa.types.is_map(t):
        return f"map<{type_name(t.key_type)},{type_name(t.item_type)}>"
    return next((name for test, name in _TYPE_NAMES if test(t)), str(t))


def canonical(t: pa.DataType) -> pa.DataType:
    """One spelling per type, whoever produced it (Delta's schema, Spark's,
    pyarrow's inference): lists named ``item``, plain strings and binaries."""
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, canonical(f.type)) for f in t])
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return pa.list_(canonical(t.value_type))
    if pa.types.is_map(t):
        return pa.map_(canonical(t.key_type), canonical(t.item_type))
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    return t
