"""Exact ingest: a 202 means exactly the bytes sent are stored; anything else is
a clear error with nothing stored.  The cases found by an outside battery of
hostile requests, each with the error it must get (or the exact bytes stored)
and a check that nothing else was stored."""

from __future__ import annotations

import gzip
import http.client
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import pytest
import zstandard
from starlette.testclient import TestClient

from gateway.app import create_app
from storage_c import Config, EntryTooLarge, Log

from .support.gateway_app import JSON, NDJSON, config, stored
from .support.processes import worker_argv
from .support.server import SMALL, GatewayProcess

if TYPE_CHECKING:
    import httpx2

OCTETS = {"content-type": "application/octet-stream"}


@pytest.fixture
def client(data_dir: Path) -> Iterator[TestClient]:
    with TestClient(create_app(config(data_dir))) as c:
        yield c


def error(r: httpx2.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body: dict[str, Any] = r.json()
    assert body["error"] == code, body
    return body


# ---- stored byte for byte -----------------------------------------------------------------

EXACT = [
    b'{"n":123456789012345678901234567890}',
    b'{"n":18446744073709551616}',
    b'{"n":-0}',
    b'{"n":-0.0}',
    b'{"n":1E400}',
    b'{"n":1e-400}',
    b'{"n":0.1000000000000000000000000001}',
    b'{"s":"\\u00e9\\u0041\\n\\"\\\\\\/"}',
    b'{"s":"\\ud83d\\ude00"}',              # a surrogate pair, escaped
    b'{"s":"\xf0\x9f\x98\x80 h\xc3\xa9"}',  # the same character as raw UTF-8
    b'{"s":"\\ud800"}',                      # a lone surrogate escape (grammar allows it)
    b'{"a":1,"a":2}',                        # duplicate keys: stored as sent
    b'{"l":[1,[2,[3]],{"x":null,"y":true,"z":false}]}',
]


@pytest.mark.parametrize("event", EXACT)
def test_events_are_stored_exactly_as_sent(client: TestClient, data_dir: Path, event: bytes) -> None:
    assert client.post("/streams/one", content=event, headers=JSON).status_code == 202
    assert client.post("/streams/arr", content=b"[" + event + b"," + event + b"]", headers=JSON).status_code == 202
    assert client.post("/streams/nd", content=event + b"\n" + event, headers=NDJSON).status_code == 202
    assert stored(data_dir, "one") == [event]
    assert stored(data_dir, "arr") == [event, event]
    assert stored(data_dir, "nd") == [event, event]


def test_only_insignificant_whitespace_is_removed(client: TestClient, data_dir: Path) -> None:
    body = b'[ {"a" : [ 1 , 2 ] ,\n "s" : " keep  these ,: " } ,\r\n\t-0 ]'
    assert client.post("/streams/ws", content=body, headers=JSON).status_code == 202
    assert stored(data_dir, "ws") == [b'{"a":[1,2],"s":" keep  these ,: "}', b"-0"]
    body = b'  {"a" : 1}  \r\n\r\n \t \n[ 2 ]\n'
    assert client.post("/streams/ws2", content=body, headers=NDJSON).status_code == 202
    assert stored(data_dir, "ws2") == [b'{"a":1}', b"[2]"]


# ---- bad bodies: the first bad event, its true line, nothing stored ------------------------

@pytest.mark.parametrize("body", [b"[1\n2]\n4,5\n", b'{"a":1\n"b":2}\n3,4\n', b"1 2\n", b'{"a":1}{"b":2}\n',
                                  b"[1,\n2]\n", b'"a\nb"\n', b"1\n2\n3,\n", b"NaN\n", b"{}\n[\n"])
def test_ndjson_lines_must_each_be_one_value(client: TestClient, data_dir: Path, body: bytes) -> None:
    error(client.post("/streams/nd", content=body, headers=NDJSON), 400, "invalid_json")
    assert stored(data_dir, "nd") == []


def test_error_names_the_true_line_after_blank_lines(client: TestClient, data_dir: Path) -> None:
    body = b'{"a":1}\n\n\n{"b":2}\n{"c":\n'
    err = error(client.post("/streams/nd", content=body, headers=NDJSON), 400, "invalid_json")
    assert err["index"] == 2 and err["line"] == 5
    assert "event 2 (line 5)" in str(err["detail"])
    body = b'[\n{"a":1},\n\n{"b":2},\n{"c" 3}]'
    err = error(client.post("/streams/nd", content=body, headers=JSON), 400, "invalid_json")
    assert err["index"] == 2 and err["line"] == 5 and body[int(err["offset"])] == ord("3")
    assert stored(data_dir, "nd") == []


@pytest.mark.parametrize("body", [b'{"n": NaN}', b'{"n": Infinity}', b'{"n": 01}', b'{"n": 1.}', b"{'a': 1}",
                                  b'{"a": 1,}', b'["\x01"]', b'["\xff"]', b'["\xed\xa0\x80"]', b'["\xc0\xaf"]',
                                  b'\xef\xbb\xbf{"a": 1}', b'["\\x41"]', b'["\\u12"]', b"[1] [2]", b'"\t"'])
def test_strict_json(client: TestClient, data_dir: Path, body: bytes) -> None:
    error(client.post("/streams/strict", content=body, headers=JSON), 400, "invalid_json")
    assert stored(data_dir, "strict") == []


def test_nesting_limit_is_a_clear_error(client: TestClient, data_dir: Path) -> None:
    ok = b"[" * 512 + b"]" * 512
    deep = b"[" * 513 + b"]" * 513
    assert client.post("/streams/deep", content=ok, headers=NDJSON).status_code == 202
    err = error(client.post("/streams/deep", content=deep, headers=NDJSON), 400, "invalid_json")
    assert "nesting" in str(err["detail"])
    assert stored(data_dir, "deep") == [ok]


@pytest.mark.parametrize("size", [64 << 10, 200 << 10, 4 << 20])
def test_pathological_invalid_bodies_are_rejected_in_linear_time(client: TestClient, data_dir: Path,
                                                                 size: int) -> None:
    bodies = [b'["' + b'\\"' * (size // 2), b"[" * size, b'["' + b"\\\\" * (size // 2) + b'"',
              b"[" + b"1," * (size // 2)]
    for body in bodies:
        t0 = time.perf_counter()
        r = client.post("/streams/slow", content=body, headers=JSON)
        assert time.perf_counter() - t0 < 1.0
        assert r.status_code == 400, r.text
    assert stored(data_dir, "slow") == []


# ---- max_entry_bytes is the size as sent ---------------------------------------------------

def test_entry_limit_counts_the_event_as_sent_not_compressed(data_dir: Path) -> None:
    cfg = config(data_dir, storage=Config(shards=4, segment_bytes=1 << 20, max_entry_bytes=1 << 20),
                 max_decompressed_bytes=8 << 20)
    with TestClient(create_app(cfg)) as c:
        big = b'[{"ok":1},{"pad":"' + b"x" * (2 << 20) + b'"}]'
        err = error(c.post("/streams/big", content=gzip.compress(big),
                           headers={**JSON, "content-encoding": "gzip"}), 413, "event_too_large")
        assert err["index"] == 1
        zeros = bytes(3 << 20)
        error(c.post("/streams/big", content=gzip.compress(zeros),
                     headers={**OCTETS, "content-encoding": "gzip"}), 413, "event_too_large")
        error(c.post("/streams/big", content=zstandard.ZstdCompressor().compress(zeros),
                     headers={**OCTETS, "content-encoding": "zstd"}), 413, "event_too_large")
        nd = b'{"ok":1}\n{"pad":"' + b"y" * (2 << 20) + b'"}\n'
        assert error(c.post("/streams/big", content=nd, headers=NDJSON), 413, "event_too_large")["line"] == 2
        # just under the limit, as sent, passes (and is stored compressed)
        fits = b'{"pad":"' + b"z" * ((1 << 20) - 10) + b'"}'
        assert len(fits) == 1 << 20
        assert c.post("/streams/fits", content=fits, headers=JSON).status_code == 202
    assert stored(data_dir, "big") == []
    assert stored(data_dir, "fits") == [fits]


def test_library_checks_the_uncompressed_size(data_dir: Path) -> None:
    with Log(data_dir, Config(shards=1, max_entry_bytes=1024)) as log:
        for payload in (b"a" * 100_000, b"d" * 2000, b"x" * 1025):
            with pytest.raises(EntryTooLarge):
                log.append("lim", payload)
            with pytest.raises(EntryTooLarge):
                log.append("lim", payload, durability="always")
            with pytest.raises(EntryTooLarge):
                log.append_batch("lim", [b"ok", payload])
            with pytest.raises(EntryTooLarge):
                log.append_delimited("lim", b"ok\n" + payload + b"\n")
            with pytest.raises(EntryTooLarge):
                log.ingest("lim", b'["' + payload + b'"]')
        log.append("lim", b"a" * 1024)  # at the limit: accepted
        assert [p for b in log.iter_entries("lim", 0) for p in b.payloads] == [b"a" * 1024]


# ---- nothing holds the event loop ----------------------------------------------------------

def test_health_answers_within_50ms_while_16mib_bodies_arrive(tmp_path: Path) -> None:
    with GatewayProcess(tmp_path / "data", workers=1, env={**SMALL, "COMET_STORAGE_SEGMENT_BYTES": str(64 << 20),
                                                    "COMET_MAX_BODY_BYTES": str(17 << 20)}) as server:
        server.wait_ready()
        poster = subprocess.Popen(worker_argv("post_big_bodies", server.port, 16 << 20),
                                  stdout=subprocess.PIPE)
        try:
            assert poster.stdout is not None
            assert poster.stdout.readline().strip() == b"ready"
            assert poster.stdout.readline().strip() == b"posted"  # the loop is under way
            took: list[float] = []
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
            for _ in range(200):
                t0 = time.perf_counter()
                conn.request("GET", "/healthz")
                r = conn.getresponse()
                r.read()
                took.append(time.perf_counter() - t0)
                assert r.status == 200
                time.sleep(0.005)
            conn.close()
            assert poster.poll() is None, "the poster failed"
            assert poster.stdout.readline().strip() == b"posted"  # and bodies kept being stored
        finally:
            poster.kill()
            poster.wait()
        # A body copied on the loop would hold every /healthz asked meanwhile, at each of the
        # bodies arriving during the 200; the machine's other work (the tests beside this one)
        # may hold one or two: the third slowest counts.
        third = sorted(took)[-3]
        assert third < 0.050, f"/healthz took {third * 1000:.1f} ms (third slowest of 200)"
