"""The envelope and the object layout, public storage_c API (comet/export.py): a
payload that is plain JSON is handed out as stored, anything else in an envelope
(``{"base64": ...}``) wherever JSON is handed out; `comet ship` lines envelope only what
would break the line framing or read as an envelope; one Hive layout for `comet ship`
and `comet spark-ship`."""

from __future__ import annotations

import base64

import orjson
import pytest

from comet.export import (
    envelope,
    is_plain_json,
    json_value,
    ndjson_batch_ok,
    ndjson_line,
    partition_path,
    payload_of,
    reads_as_envelope,
)


# ---- the envelope and the layout -----------------------------------------------------------


@pytest.mark.parametrize("payload", [b'{"a":1}', b"[1, 2]", b'"s"', b"-0", b"1E400",
                                     b'{"a":1,"a":2}', b"123456789012345678901234567890"])
def test_plain_json_is_handed_out_as_stored(payload: bytes) -> None:
    assert is_plain_json(payload)
    assert orjson.dumps({"v": json_value(payload)}) == b'{"v":' + payload + b"}"
    assert ndjson_line(payload) == payload + b"\n"


@pytest.mark.parametrize("payload", [b"", b"x", b"\x00\xff", b"1\n2", b'{"a":\n1}', b"[1,]",
                                     b'{"base64":"eA=="}', b'{ "base64" : "x" }', b"NaN",
                                     b'{"\\u0062ase64":"eA=="}'])
def test_anything_else_is_enveloped_where_json_is_handed_out(payload: bytes) -> None:
    assert not is_plain_json(payload)
    wrapped = {"base64": base64.b64encode(payload).decode()}
    assert json_value(payload) == wrapped == envelope(payload)
    assert payload_of(wrapped) == payload


@pytest.mark.parametrize("payload", [b"1\n2", b'{"base64":"eA=="}', b'{ "base64" : "x" }',
                                     b'{"\\u0062ase64":"eA=="}'])
def test_ship_lines_envelope_what_breaks_the_framing_or_reads_as_an_envelope(payload: bytes) -> None:
    line = ndjson_line(payload)
    assert line.count(b"\n") == 1 and line.endswith(b"\n")
    assert payload_of(orjson.loads(line)) == payload


def test_ship_lines_keep_one_line_payloads_as_stored() -> None:
    for payload in (b'{"a":1}', b"not json", b"\x00\xff", b'{"base64":1}', b'{"base64":"x","y":1}', b""):
        assert ndjson_line(payload) == payload + b"\n"
    assert not reads_as_envelope(b'{"base64":"x","y":1}') and reads_as_envelope(b'{"base64":""}')


def test_a_whole_ship_batch_is_checked_by_substring() -> None:
    good = [b'{"a":1}', b"[2]", b"raw bytes", b""]
    assert ndjson_batch_ok(b"".join(p + b"\n" for p in good))
    for bad in ([b'{"base64":"eA=="}'] + good, good + [b'{ "base64" : "x" }']):
        assert not ndjson_batch_ok(b"".join(p + b"\n" for p in bad))
    assert not ndjson_batch_ok(b'{"base64":"eA=="}\n')  # at the very start too


def test_payload_of_reads_plain_values_back() -> None:
    assert payload_of({"a": 1}) == b'{"a":1}'
    assert payload_of({"base64": "not base64!"}) == b'{"base64":"not base64!"}'


def test_one_hive_layout() -> None:
    from consumers import object_key
    from spark_jobs.lake.layout import partition_dir

    ns = 1_800_000_000 * 10**9  # 2027-01-15T08:00:00Z
    hour = ns // (3600 * 10**9)
    assert partition_path("ev", ns) == "stream=ev/dt=2027-01-15/hour=08"
    assert object_key("ev", 3, hour, 0, 9).startswith("stream=ev/dt=2027-01-15/hour=08/shard=0003/")
    assert partition_dir("ev", hour) == partition_path("ev", ns)
