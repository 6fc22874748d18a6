"""The OTLP streams in the lake: ``comet spark-ship`` ships the gateway's
events (tests/support/otlp.py's layout) with the built-in schemas
(spark_jobs/spark/otlp_schema.py), without ``--schema`` and without a JVM (the
tasks run in this process: tests/support/lake.py)."""

from __future__ import annotations

import base64
import json
import math
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest
from click.testing import CliRunner

from spark_jobs.spark import otlp_rows
from spark_jobs.spark.cli import spark_ship
from spark_jobs.lake.delta import LakeTable
from spark_jobs.lake.read import read_table
from spark_jobs.lake.lakefs import Lake
from spark_jobs.spark.otlp_schema import DDL, STREAM_SIGNALS, ddl, signal_of, value_type
from spark_jobs.spark.ship import ShipOptions, ShipReport, ship
from storage_c import Config, Log

from .support import otlp
from .support.lake import check_exactly_once, duckdb_table, in_process
from .support.otlp_requests import REQUESTS, T0_NS

CFG = Config(shards=2, segment_bytes=1 << 20)
REPO = Path(__file__).resolve().parent.parent
UTC = timezone.utc


def append(data_dir: Path, stream: str, lines: list[bytes]) -> None:
    """NDJSON lines into shard 0 of ``stream`` (2 shards), in order, as the gateway stores them."""
    with Log(data_dir, CFG) as log:
        if stream not in log.streams():
            log.create_stream(stream, 2)
        log.append_delimited(stream, b"".join(line + b"\n" for line in lines), shard=0)


def run(data_dir: Path, stream: str, lake: Lake, **kw: Any) -> ShipReport:
    return ship(ShipOptions(str(data_dir), stream, lake, **kw), in_process)


def events_of(signal: str) -> list[dict[str, Any]]:
    events, rejected = otlp.events(signal, REQUESTS[signal]().SerializeToString())
    assert rejected == 0 and events
    return events


def rows_of(lake: Lake, stream: str) -> list[dict[str, Any]]:
    rows = read_table(lake, stream).to_pylist()
    return sorted(rows, key=lambda r: (r["_comet_shard"], r["_comet_entry"]))


# ---- an oracle of the rows, from the documented rules ------------------------------------

def text(v: Any) -> str | None:
    """A string as itself, null as null, any other JSON value as its JSON text."""
    if v is None or isinstance(v, str):
        return v
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def as_double(v: Any) -> float | None:
    return None if v is None else float(v)  # float("NaN"), float("Infinity") too


def at(ns: int) -> datetime | None:
    """The timestamp of nanoseconds since the epoch: to the microsecond, null for 0."""
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=ns // 1000) if ns else None


def expected(value: Any, t: pa.DataType, siblings: dict[str, Any] | None = None) -> Any:
    """What a column of type ``t`` holds for the event's ``value``."""
    if value is None:
        return None
    if pa.types.is_struct(t):
        out = {}
        for f in t:
            if pa.types.is_timestamp(f.type):
                out[f.name] = at(value.get(f"{f.name}_unix_nano", 0))
            elif f.name == "duration_ns":
                start, end = value["start_time_unix_nano"], value["end_time_unix_nano"]
                out[f.name] = end - start if start and end else None
            elif f.name == "as_int":
                out[f.name] = value["value"] if type(value.get("value")) is int else None
            else:
                out[f.name] = expected(value.get(f.name), f.type)
        return out
    if pa.types.is_map(t):
        return [(k, text(v)) for k, v in value.items()]
    if pa.types.is_list(t):
        return [expected(v, t.value_type) for v in value]
    if pa.types.is_string(t):
        return text(value)
    if pa.types.is_floating(t):
        return as_double(value)
    return value


def same(a: Any, b: Any) -> bool:
    """Equal, NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return bool(a == b)


# ---- the tests ----------------------------------------------------------------------------

def test_the_three_streams_ship_without_a_schema_into_typed_columns(data_dir: Path, tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"))  # one lake, one table: the three schemas agree
    events = {signal: events_of(signal) for signal in REQUESTS}
    for signal, evs in events.items():
        append(data_dir, f"otel-{signal}", [orjson.dumps(e) for e in evs])
        report = run(data_dir, f"otel-{signal}", lake)
        assert (report.run, report.rows, report.rejects) == (1, len(evs), 0)
        check_exactly_once(lake, data_dir, f"otel-{signal}", CFG)
    columns = {f.name: f.type for f in LakeTable.main(lake).value_type()}
    for signal in REQUESTS:
        schema = value_type(signal)
        assert {f.name: columns[f.name] for f in schema} == {f.name: f.type for f in schema}
        rows = rows_of(lake, f"otel-{signal}")
        assert len(rows) == len(events[signal])
        for row, event in zip(rows, events[signal]):
            want = expected(event, schema)
            for name in want:  # field by field, for a message that says which
                assert same(row[name], want[name]), (signal, row["_comet_entry"], name, row[name], want[name])
    # the types, as a reader sees them
    assert pa.types.is_timestamp(columns["time"]) and columns["time"].tz == "UTC"
    for name in ("start_time", "end_time", "observed_time"):
        assert columns[name] == columns["time"]
    for name in ("attributes", "value_types"):
        assert columns[name] == pa.map_(pa.string(), pa.string())
    assert columns["resource"].field("attributes").type == pa.map_(pa.string(), pa.string())
    assert columns["events"].value_type.field("time").type == columns["time"]
    assert columns["exemplars"].value_type.field("filtered_attributes").type == columns["attributes"]
    assert (columns["flags"], columns["severity_number"], columns["value"]) == (pa.int64(), pa.int32(), pa.float64())

    # ... and values spelled out, beyond the oracle
    logs = rows_of(lake, "otel-logs")
    first = logs[0]
    assert (first["time_unix_nano"], first["observed_time_unix_nano"]) == (T0_NS, T0_NS + 1000)
    assert first["time"] == datetime(2025, 11, 21, 4, 40, 0, 123456, tzinfo=UTC)  # microseconds
    assert logs[1]["observed_time_unix_nano"] == 0 and logs[1]["observed_time"] is None
    attributes = dict(first["attributes"])
    assert attributes == {
        "s": "text", "empty": "", "b": "true", "i": "-42", "big": "9223372036854775807", "d": "2.5",
        "whole": "3.0", "nan": "NaN", "inf": "Infinity", "ninf": "-Infinity",
        "raw": base64.b64encode(b"\x00\xff\x10").decode(), "list": '[1,"two",3.5,false,null,"AQ=="]',
        "map": '{"k":"v","n":{"deep":[1,{"x":null}]}}', "unset": None, "uni": 'h\u00e9 \u2603 "q"'}
    assert dict(first["value_types"]) == {"/attributes/inf": "double", "/attributes/list/5": "bytes",
                                          "/attributes/nan": "double", "/attributes/ninf": "double",
                                          "/attributes/raw": "bytes"}
    assert [r["body"] for r in logs] == ["plain text", "17", "2.25", "true", '["x",1]',
                                         '{"msg":"hi","n":{"m":[1.5]}}', "3q0=", "NaN", None, "", None]
    assert dict(logs[6]["value_types"]) == {"/body": "bytes"}
    assert (first["flags"], first["trace_id"], first["span_id"]) == (
        0xFFFFFFFF, "000102030405060708090a0b0c0d0e0f", "08090a0b0c0d0e0f")
    assert first["resource"] == {
        "attributes": [("service.name", "checkout"), ("host.id", "7"), ("tags", '["a","b"]')],
        "dropped_attributes_count": 2, "schema_url": "https://opentelemetry.io/schemas/1.30.0",
        "entity_refs": [{"schema_url": "s", "type": "host", "id_keys": ["host.id"],
                         "description_keys": ["host.name"]}]}
    assert first["scope"] == {"name": "app.logger", "version": "1.2.3", "attributes": [("lib.flag", "true")],
                              "dropped_attributes_count": 1, "schema_url": "scope-schema"}
    assert (logs[-1]["time"], logs[-1]["attributes"], logs[-1]["dropped_attributes_count"]) == (None, [], None)

    spans = rows_of(lake, "otel-traces")
    assert [(s["start_time_unix_nano"], s["end_time_unix_nano"], s["duration_ns"]) for s in spans] == [
        (T0_NS, 0, None), (T0_NS, T0_NS + 1_234_567_891, 1_234_567_891),
        (T0_NS, T0_NS + 2_469_135_782, 2_469_135_782)]
    assert spans[0]["end_time"] is None
    last = spans[2]
    assert [(e["time_unix_nano"], e["time"], e["name"], dict(e["attributes"])) for e in last["events"]] == [
        (T0_NS + 5 + j, datetime(2025, 11, 21, 4, 40, 0, 123456, tzinfo=UTC), f"ev-{j}",
         {"exception.type": "E", "n": str(j), "raw": "Bw=="}) for j in range(2)]
    assert [(dict(link["attributes"]), link["flags"], link["dropped_attributes_count"]) for link in last["links"]] == [
        ({"link.n": "0", "d": "-Infinity"}, 0, 3), ({"link.n": "1", "d": "-Infinity"}, 1, 3)]
    assert (last["status"], last["kind"], last["dropped_links_count"]) == ({"code": 2, "message": "bad"}, 3, 4)

    points = {(p["metric"]["name"], p["time_unix_nano"]): p for p in rows_of(lake, "otel-metrics")}
    gauge = [points[("temp", T0_NS + i)] for i in range(5)]
    assert [(p["value"], p["as_int"]) for p in gauge[:2]] == [(21.5, None), (-7.0, -7)]
    assert math.isnan(gauge[2]["value"]) and gauge[2]["as_int"] is None
    assert (gauge[3]["value"], gauge[3]["as_int"]) == (9.223372036854776e18, (1 << 63) - 1)  # exact as_int
    assert (gauge[4]["value"], gauge[4]["as_int"]) == (2.0, None)  # a double point of a whole value
    assert gauge[0]["metric"] == {"name": "temp", "description": "temperature", "unit": "Cel", "type": "gauge",
                                  "aggregation_temporality": None, "is_monotonic": None,
                                  "metadata": [("origin", "sensor"), ("rev", "3")]}
    assert (gauge[0]["start_time"], gauge[0]["count"], gauge[0]["exemplars"]) == (None, None, [])
    total = points[("requests", T0_NS)]
    assert (total["value"], total["as_int"], total["metric"]["is_monotonic"]) == (12345.0, 12345, True)
    assert total["start_time"] == datetime(2025, 11, 21, 4, 39, 59, 123456, tzinfo=UTC)
    assert [(e["value"], e["as_int"], e["time"], e["span_id"], dict(e["filtered_attributes"]))
            for e in total["exemplars"]] == [
        (3.0, 3, datetime(2025, 11, 21, 4, 40, 0, 123456, tzinfo=UTC), "01" * 8, {"user": "u1", "raw": "AA=="}),
        (math.inf, None, None, "", {})]
    hist = points[("latency", T0_NS)]
    assert (hist["count"], hist["sum"], hist["min"], hist["max"]) == (6, 12.5, 0.5, 7.0)
    assert (hist["bucket_counts"], hist["explicit_bounds"]) == ([1, 2, 3], [1.0, 5.0])
    assert [e["value"] for e in hist["exemplars"]] == [0.75]
    empty = points[("latency", T0_NS + 1)]
    assert (empty["count"], empty["sum"], empty["min"], empty["bucket_counts"]) == (0, None, None, [])
    expo = points[("size", T0_NS)]
    assert (expo["scale"], expo["zero_count"], expo["zero_threshold"]) == (-2, 1, 1e-9)
    assert (expo["positive"], expo["negative"]) == ({"offset": -3, "bucket_counts": [4, 0, 2]},
                                                    {"offset": 1, "bucket_counts": [2]})
    summary = points[("rtt", T0_NS)]
    assert (summary["count"], summary["sum"], summary["exemplars"]) == (4, math.inf, None)
    assert [q["quantile"] for q in summary["quantile_values"]] == [0.0, 0.5, 1.0]
    assert math.isnan(summary["quantile_values"][2]["value"])

    # another reader: DuckDB, a map lookup and a timestamp
    found = duckdb_table(lake.root, "select resource.attributes['service.name'] as service, "
                                    "attributes['nan'] as nan, time from delta_scan('{root}') "
                                    "where stream = 'otel-logs' and _comet_entry = 0").to_pylist()
    assert found == [{"service": "checkout", "nan": "NaN", "time": first["time"]}]


def test_a_repeated_key_keeps_the_last_value_and_what_does_not_fit_is_a_reject(
        data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(otlp_rows, "CHUNK_ROWS", 3)  # rows and rejects in several chunks
    lake = Lake(str(tmp_path / "lake"))
    repeated = (b'{"resource":{"attributes":{"k":"first","k":"last","n":1}},"time_unix_nano":5000,'
                b'"body":{"x":1,"x":{"y":2,"y":3}},"attributes":{"a":1,"b":true,"a":"two"},'
                b'"value_types":{"/body":"bytes","/body":"double"}}')
    beyond = orjson.dumps({"time_unix_nano": (1 << 64) - 1, "body": "kept in the rejects"})
    nested = orjson.dumps({"scope": {"dropped_attributes_count": 1 << 63}})
    wrong = orjson.dumps({"attributes": ["a", "b"]})
    lines = [repeated, beyond, b"not json", b"[1, 2]", nested, wrong, orjson.dumps({"severity_text": "ok"})]
    append(data_dir, "otel-logs", lines)
    report = run(data_dir, "otel-logs", lake)
    assert (report.rows, report.rejects) == (2, 5)
    rows, rejects = check_exactly_once(lake, data_dir, "otel-logs", CFG)
    first, last = sorted(rows.to_pylist(), key=lambda r: r["_comet_entry"])
    assert (first["resource"]["attributes"], first["attributes"]) == ([("k", "last"), ("n", "1")],
                                                                      [("a", "two"), ("b", "true")])
    assert (first["body"], first["value_types"], first["time"]) == (
        '{"x":{"y":3}}', [("/body", "double")], datetime(1970, 1, 1, 0, 0, 0, 5, tzinfo=UTC))
    assert last["severity_text"] == "ok" and last["attributes"] is None
    why = {r["entry"]: (r["value"], re.sub(r"^shard 0 entry \d+: ", "", r["error"]))
           for r in rejects.to_pylist()}
    assert why == {
        1: (beyond, "field 'time_unix_nano' is 18446744073709551615, beyond the range of the lake's "
                    "long column (-9223372036854775808 to 9223372036854775807)"),
        2: (b"not json", why[2][1]),
        3: (b"[1, 2]", "not a JSON object but an array"),
        4: (nested, "field 'scope.dropped_attributes_count' is 9223372036854775808, beyond the range of "
                    "the lake's long column (-9223372036854775808 to 9223372036854775807)"),
        5: (wrong, "field 'attributes' is an array here, the lake's column is map<string,string>")}
    assert why[2][1].startswith("not JSON: ")


def test_the_signal_comes_from_the_stream_name_or_otlp_and_a_schema_wins() -> None:
    assert [signal_of(stream, None, None) for stream in STREAM_SIGNALS] == ["logs", "traces", "metrics"]
    assert signal_of("events", None, None) is None
    assert signal_of("otel-logs", None, "id long") is None  # an explicit schema wins
    assert signal_of("app-spans", "traces", None) == "traces"
    with pytest.raises(ValueError, match="not both"):
        signal_of("otel-logs", "logs", "id long")
    with pytest.raises(ValueError, match="OTLP signal 'spans': use one of logs, traces, metrics"):
        signal_of("x", "spans", None)
    out = CliRunner().invoke(spark_ship, ["data", "otel-logs", "lake", "--otlp", "logs", "--schema", "a long"])
    assert out.exit_code == 2 and "give --otlp or a schema (--schema, --schema-file), not both" in out.output


def test_otlp_ships_a_stream_of_another_name(data_dir: Path, tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"))
    spans = events_of("traces")
    append(data_dir, "app-spans", [orjson.dumps(e) for e in spans])
    assert run(data_dir, "app-spans", lake, otlp="traces").rows == len(spans)
    rows = rows_of(lake, "app-spans")
    assert [r["duration_ns"] for r in rows] == [None, 1_234_567_891, 2_469_135_782]
    assert LakeTable.main(lake).value_type() == value_type("traces")


def test_a_run_a_crash_interrupted_is_redone_with_the_otlp_schema(
        data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan says the stream is OTLP: the redo (by a call that could not tell
    from the stream's name) reads the events as the crashed attempt did."""
    from spark_jobs.spark import ship as ship_module

    class Killed(BaseException):
        pass

    def cut_point(name: str) -> None:
        if name == "spark_ship.resolved":
            raise Killed(name)

    lake = Lake(str(tmp_path / "lake"))
    spans = events_of("traces")
    append(data_dir, "app-spans", [orjson.dumps(e) for e in spans])
    with monkeypatch.context() as patched:
        patched.setattr(ship_module, "cut_point", cut_point)
        with pytest.raises(Killed):
            run(data_dir, "app-spans", lake, otlp="traces")
    assert read_table(lake, "app-spans").num_columns == 0  # nothing committed
    report = run(data_dir, "app-spans", lake)  # no --otlp: the plan knows
    assert (report.resumed, report.rows, report.rejects) == (1, len(spans), 0)
    assert [r["duration_ns"] for r in rows_of(lake, "app-spans")] == [None, 1_234_567_891, 2_469_135_782]
    check_exactly_once(lake, data_dir, "app-spans", CFG)


def test_a_lake_column_of_another_type_is_a_clear_error(data_dir: Path, tmp_path: Path) -> None:
    """A lake whose ``attributes`` column a stream of plain JSON made a struct."""
    lake = Lake(str(tmp_path / "lake"))
    append(data_dir, "app", [orjson.dumps({"attributes": {"a": 1}})])
    run(data_dir, "app", lake)
    append(data_dir, "otel-logs", [orjson.dumps(events_of("logs")[0])])
    with pytest.raises(ValueError, match=re.escape(
            "the built-in schema of OTLP logs changes the type of a column the lake has: attributes is "
            "struct<a long> in the lake, map<string,string> in the schema")):
        run(data_dir, "otel-logs", lake)


def test_the_docs_show_the_schemas_as_declared() -> None:
    page = " ".join((REPO / "docs" / "spark-and-the-lake.md").read_text().split())
    for signal in DDL:
        assert ddl(signal) in page, f"docs/spark-and-the-lake.md lacks the {signal} schema as declared"
