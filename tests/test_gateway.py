"""The gateway in process (SPEC 4): every content type and encoding, every
error status with nothing stored, auth, metrics."""

from __future__ import annotations

import asyncio
import gzip
import threading
import zlib
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Iterator

import httpx
import orjson
import pytest
import zstandard
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.config import GatewayConfig, StreamPolicy
from gateway.writes import ShardHops
from storage_c import BatchResult, Config, Durability, Log, SyncFailed
from storage_c.testing import SYNC, faults

from .support.gateway_app import JSON, NDJSON, STORAGE, config, in_shard, stored

if TYPE_CHECKING:
    import httpx2


@pytest.fixture
def client(data_dir: Path) -> Iterator[TestClient]:
    with TestClient(create_app(config(data_dir))) as c:
        yield c


# ---- what goes in comes out -------------------------------------------------------------

EVENTS = [{"n": i, "msg": "héllo", "tags": ["a", "b"], "v": 1.5} for i in range(5)]


@pytest.mark.parametrize("encoding", ["identity", "gzip", "deflate", "zstd"])
@pytest.mark.parametrize("keyed", [False, True])
def test_every_type_and_encoding(client: TestClient, data_dir: Path, encoding: str, keyed: bool) -> None:
    def enc(body: bytes) -> bytes:
        if encoding == "gzip":
            return gzip.compress(body)
        if encoding == "zstd":
            return zstandard.ZstdCompressor().compress(body)
        if encoding == "deflate":
            return zlib.compress(body)
        return body

    headers = {"content-encoding": encoding} if encoding != "identity" else {}
    params = {"key": "user-7"} if keyed else {}
    ndjson = b"\n".join(orjson.dumps(e) for e in EVENTS) + b"\n\n"
    blob = bytes(range(256)) * 3
    requests: list[tuple[str, bytes, list[Any]]] = [
        ("application/json", orjson.dumps(EVENTS[0]), [EVENTS[0]]),
        ("application/json", orjson.dumps(EVENTS), EVENTS),
        ("application/x-ndjson", ndjson, EVENTS),
        ("application/jsonl", ndjson, EVENTS),
        ("application/octet-stream", blob, [blob]),
    ]
    shards = set()
    for kind, body, expected in requests:
        r = client.post("/streams/ev", content=enc(body), params=params,
                        headers={"content-type": kind, **headers})
        assert r.status_code == 202, r.text
        got = r.json()
        assert got["count"] == len(expected) and got["last"] == got["first"] + got["count"] - 1
        shards.add(got["shard"])
        entries = in_shard(data_dir, "ev", got["shard"])[got["first"]: got["last"] + 1]
        if kind == "application/octet-stream":
            assert entries == expected  # byte-equal
        else:
            assert [orjson.loads(e) for e in entries] == expected  # orjson-equal
    if keyed:
        assert len(shards) == 1  # one key, one shard


def test_keyed_events_keep_their_order(client: TestClient, data_dir: Path) -> None:
    for i in range(20):
        r = client.post("/streams/k", content=b'{"i": %d}' % i, headers={**JSON, "X-Comet-Key": "dev-1"})
        assert r.status_code == 202
    shard = r.json()["shard"]
    assert [orjson.loads(p)["i"] for p in in_shard(data_dir, "k", shard)] == list(range(20))


def test_validation_can_be_turned_off_per_stream(data_dir: Path) -> None:
    cfg = config(data_dir, streams={"raw": StreamPolicy(validate=False)})
    with TestClient(create_app(cfg)) as c:
        body = b"not json\n{\"ok\": 1}\n"
        assert c.post("/streams/raw", content=body, headers=NDJSON).status_code == 202
        assert c.post("/streams/checked", content=body, headers=NDJSON).status_code == 400
    assert stored(data_dir, "raw") == [b"not json", b'{"ok": 1}']
    assert stored(data_dir, "checked") == []


# ---- every error, and nothing stored --------------------------------------------------------


def assert_error(r: httpx2.Response, status: int, code: str) -> dict[str, object]:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["error"] == code and isinstance(body["detail"], str) and body["detail"]
    return body


def still_works(client: TestClient, stream: str = "ev") -> None:
    r = client.post(f"/streams/{stream}", content=b'{"after": true}', headers=JSON)
    assert r.status_code == 202


def test_malformed_event_57_of_100(client: TestClient, data_dir: Path) -> None:
    lines = [orjson.dumps({"i": i}) for i in range(100)]
    lines[56] = b'{"i": 56,'
    body = assert_error(client.post("/streams/ev", content=b"\n".join(lines), headers=NDJSON),
                        400, "invalid_json")
    assert body["index"] == 56 and "event 56 (line 57)" in str(body["detail"])
    two = b'{"a":1}\n{"b":2},{"c":3}\n'
    assert assert_error(client.post("/streams/ev", content=two, headers=NDJSON), 400, "invalid_json")["index"] == 1
    assert assert_error(client.post("/streams/ev", content=b'[{"a":1}, {"b":', headers=JSON),
                        400, "invalid_json")["index"] == 1
    elements = [orjson.dumps({"i": i, "s": "é, [x]"}) for i in range(100)]
    elements[56] = b'{"i": 56 "s": 1}'
    body = assert_error(client.post("/streams/ev", content=b"[" + b",".join(elements) + b"]", headers=JSON),
                        400, "invalid_json")
    assert body["index"] == 56 and "event 56" in str(body["detail"])
    no_index = assert_error(client.post("/streams/ev", content=b'[1, 2] 3', headers=JSON), 400, "invalid_json")
    assert "index" not in no_index
    assert stored(data_dir, "ev") == []
    still_works(client)


def test_empty_bodies(client: TestClient, data_dir: Path) -> None:
    for body, headers in [(b"", JSON), (b"  \n", NDJSON), (b"[]", JSON), (b"", {"content-type": "application/octet-stream"})]:
        assert_error(client.post("/streams/ev", content=body, headers=headers), 400, "empty_body")
    assert stored(data_dir, "ev") == []
    still_works(client)


def test_body_above_the_limit(client: TestClient, data_dir: Path) -> None:
    big = b"x" * (20 << 20)
    assert_error(client.post("/streams/ev", content=big, headers={"content-type": "application/octet-stream"}),
                 413, "body_too_large")

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit holds while reading
        for _ in range(20):
            yield b"y" * (1 << 20)

    assert_error(client.post("/streams/ev", content=chunks(), headers={"content-type": "application/octet-stream"}),
                 413, "body_too_large")
    assert stored(data_dir, "ev") == []
    still_works(client)


@pytest.fixture(scope="module")
def gzip_bomb() -> bytes:
    """1 GiB of zeros, gzip-compressed (about 1 MB)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(8 << 20)
    return b"".join(packer.compress(zeros) for _ in range(128)) + packer.flush()


def test_decompression_bomb(client: TestClient, data_dir: Path, gzip_bomb: bytes) -> None:
    assert len(gzip_bomb) < 2 << 20
    r = client.post("/streams/ev", content=gzip_bomb,
                    headers={"content-type": "application/octet-stream", "content-encoding": "gzip"})
    assert_error(r, 413, "decompressed_too_large")
    bomb = zstandard.ZstdCompressor(level=19).compress(bytes(256 << 20))
    r = client.post("/streams/ev", content=bomb,
                    headers={"content-type": "application/octet-stream", "content-encoding": "zstd"})
    assert_error(r, 413, "decompressed_too_large")
    assert_error(client.post("/streams/ev", content=b"not gzip", headers={**JSON, "content-encoding": "gzip"}),
                 400, "bad_encoding")
    assert stored(data_dir, "ev") == []
    still_works(client)


def test_media_types_and_encodings(client: TestClient, data_dir: Path) -> None:
    assert_error(client.post("/streams/ev", content=b"<a/>", headers={"content-type": "text/xml"}),
                 415, "unsupported_media_type")
    assert_error(client.post("/streams/ev", content=b"{}"), 415, "unsupported_media_type")
    assert_error(client.post("/streams/ev", content=b"{}", headers={**JSON, "content-encoding": "br"}),
                 415, "unsupported_encoding")
    assert stored(data_dir, "ev") == []
    still_works(client)


@pytest.mark.parametrize("path", ["/streams/..%2Fetc", "/streams/a%2Fb", "/streams/" + "x" * 65,
                                  "/streams/.hidden", "/streams/a%00b", "/streams/"])
def test_bad_stream_names(client: TestClient, data_dir: Path, path: str) -> None:
    for method in ("POST", "GET"):
        assert_error(client.request(method, path, content=b"{}", headers=JSON), 400,
                     "invalid_stream_name")
    assert sorted(p.name for p in data_dir.iterdir() if not p.name.startswith(".")) == []
    still_works(client)


def test_a_path_below_a_stream_that_is_no_route_is_404(client: TestClient, data_dir: Path) -> None:
    for method in ("POST", "GET"):
        body = assert_error(client.request(method, "/streams/a/b", content=b"{}", headers=JSON),
                            404, "not_found")
        assert body["detail"] == f"no route for {method} /streams/a/b"
    assert sorted(p.name for p in data_dir.iterdir() if not p.name.startswith(".")) == []
    still_works(client)


def test_event_above_the_entry_limit(data_dir: Path) -> None:
    cfg = config(data_dir, storage=Config(shards=4, max_entry_bytes=1000, compression_threshold=0))
    with TestClient(create_app(cfg)) as c:
        body = b'{"ok": 1}\n{"big": "' + b"x" * 2000 + b'"}\n'
        assert_error(c.post("/streams/ev", content=body, headers=NDJSON), 413, "event_too_large")
        still_works(c)
    assert stored(data_dir, "ev") == [b'{"after":true}']


def test_unknown_stream_without_auto_create(data_dir: Path) -> None:
    with Log(data_dir, STORAGE) as log:
        log.create_stream("known", 4)
    with TestClient(create_app(config(data_dir, auto_create=False))) as c:
        assert_error(c.post("/streams/unknown", content=b"{}", headers=JSON), 404, "unknown_stream")
        assert c.post("/streams/known", content=b"{}", headers=JSON).status_code == 202
    assert not (data_dir / "unknown").exists()


def test_auth(data_dir: Path) -> None:
    cfg = config(data_dir, auth="on", tokens=("s3cret-token", "other-token"))
    with TestClient(create_app(cfg)) as c:
        r = c.post("/streams/ev", content=b"{}", headers=JSON)
        assert_error(r, 401, "unauthorized")
        assert r.headers["www-authenticate"] == "Bearer"
        assert_error(c.post("/streams/ev", content=b"{}", headers={**JSON, "authorization": "Basic eA=="}),
                     401, "unauthorized")
        assert_error(c.post("/streams/ev", content=b"{}", headers={**JSON, "authorization": "Bearer nope"}),
                     403, "forbidden")
        assert_error(c.get("/metrics", headers={"authorization": "Bearer nope"}), 403, "forbidden")
        assert c.get("/healthz").status_code == 200  # probes stay open
        ok = c.post("/streams/ev", content=b"{}", headers={**JSON, "authorization": "Bearer s3cret-token"})
        assert ok.status_code == 202
    assert stored(data_dir, "ev") == [b"{}"]


def test_auth_defaults() -> None:
    assert not GatewayConfig(host="127.0.0.1").auth_required
    assert not GatewayConfig(host="::1").auth_required
    assert GatewayConfig(host="0.0.0.0", tokens=("t0ken-t0ken",)).auth_required
    assert not GatewayConfig(host="0.0.0.0", auth="off").auth_required
    with pytest.raises(ValueError, match="no tokens"):
        GatewayConfig(auth="on")


def test_storage_full_is_507(data_dir: Path) -> None:
    storage = Config(shards=1, segment_bytes=64 << 10, retention_max_total_bytes=4 * (64 << 10),
                     retention_interval_ms=0)
    with Log(data_dir, storage) as log:
        log.create_stream("full", 1)
        log.group("full", 0, "slow")  # unconsumed data may not be deleted
    with TestClient(create_app(config(data_dir, storage=storage))) as c:
        statuses = []
        for i in range(400):
            r = c.post("/streams/full", content=b'{"i": %d, "pad": "%s"}' % (i, b"p" * 900), headers=JSON)
            statuses.append(r.status_code)
            if r.status_code != 202:
                break
        body = assert_error(r, 507, "storage_full")
        assert r.headers["retry-after"] == "1"
        assert "budget" in str(body["detail"])
    accepted = statuses.count(202)
    assert [orjson.loads(p)["i"] for p in stored(data_dir, "full")] == list(range(accepted))


@pytest.mark.parametrize("durability", ["interval", "always"])
def test_a_failed_sync_is_503_until_the_gateway_opens_the_shard_again(
        data_dir: Path, durability: Durability) -> None:
    """A sync that failed: the shard's appends get 503 sync_failed naming the
    failure (never a 202 that the next sync could not keep, never a 500); the
    gateway started again (a reload or restart) repairs the shard and every
    event acknowledged with 202 is there once."""
    storage = Config(shards=1, segment_bytes=1 << 20, durability=durability)
    with TestClient(create_app(config(data_dir, storage=storage))) as c:
        for i in range(5):
            assert c.post("/streams/ev", content=b'{"i": %d}' % i, headers=JSON).status_code == 202
        with faults(SYNC):
            r = c.post("/streams/ev", content=b'{"i": 5}', headers=JSON)
            if durability == "interval":  # acknowledged before its sync, which the flusher makes
                assert r.status_code == 202
                with pytest.raises(SyncFailed):  # this sync or the flusher's failed
                    c.app.state.runtime.log.sync("ev")  # type: ignore[attr-defined]
            else:  # the client is told: its retry stores the event once
                assert_error(r, 503, "sync_failed")
        answers = [c.post("/streams/ev", content=b'{"i": 6}', headers=JSON) for _ in range(3)]
        for r in answers:
            body = assert_error(r, 503, "sync_failed")
            assert "Input/output error" in str(body["detail"]) and r.headers["retry-after"] == "1"
        shard = c.get("/streams/ev").json()["shards"][0]
        assert shard["sync_failed"] == "EIO"
    acknowledged = 6 if durability == "interval" else 5
    with TestClient(create_app(config(data_dir, storage=storage))) as c:
        assert c.get("/streams/ev").json()["shards"][0]["sync_failed"] is None
        for i in range(acknowledged, 8):
            assert c.post("/streams/ev", content=b'{"i": %d}' % i, headers=JSON).status_code == 202
    assert [orjson.loads(p)["i"] for p in stored(data_dir, "ev")] == list(range(8))


def test_starting_worker_answers_503(data_dir: Path) -> None:
    with Log(data_dir, Config(process_count=1), claim_slot=True):  # another process holds the slot
        with TestClient(create_app(config(data_dir, slot_wait_s=0.2))) as c:
            r = c.post("/streams/ev", content=b"{}", headers=JSON)
            assert_error(r, 503, "starting")
            assert r.headers["retry-after"] == "1"
            assert c.get("/readyz").status_code == 503
    assert stored(data_dir, "ev") == []


def test_inflight_budget_is_429(data_dir: Path) -> None:
    app = create_app(config(data_dir, inflight_bytes=1000))

    async def scenario() -> tuple[int, int, int]:
        transport = httpx.ASGITransport(app=app)
        release = asyncio.Event()

        async def slow_body() -> AsyncIterator[bytes]:
            yield b'{"slow": "' + b"s" * 600
            await release.wait()
            yield b'"}'

        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
                first = asyncio.create_task(client.post(
                    "/streams/ev", content=slow_body(),
                    headers={**JSON, "content-length": str(612)}))
                await asyncio.sleep(0.2)
                second = await client.post("/streams/ev", content=b'{"x": "' + b"y" * 500 + b'"}',
                                           headers=JSON)
                release.set()
                done = await first
                third = await client.post("/streams/ev", content=b'{"x": 1}', headers=JSON)
                assert second.json()["error"] == "busy" and second.headers["retry-after"] == "1"
                return second.status_code, done.status_code, third.status_code

    assert asyncio.run(scenario()) == (429, 202, 202)
    assert len(stored(data_dir, "ev")) == 2


# ---- reads and metrics --------------------------------------------------------------


def test_a_stream_deleted_while_streams_are_listed_is_left_out(
        client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    client.post("/streams/ev", content=b"{}", headers=JSON)
    listed = Log.streams
    monkeypatch.setattr(Log, "streams", lambda self: [*listed(self), "gone"])
    r = client.get("/streams")
    assert r.status_code == 200
    assert [s["name"] for s in r.json()["streams"]] == ["ev"]


def test_reads(client: TestClient) -> None:
    client.post("/streams/ev?key=a", content=b'{"a": 1}\n{"a": 2}', headers=NDJSON)
    shard = client.post("/streams/ev?key=a", content=b"\x00bin", headers={"content-type": "application/octet-stream"}).json()["shard"]
    assert [s["name"] for s in client.get("/streams").json()["streams"]] == ["ev"]
    desc = client.get("/streams/ev").json()
    assert desc["entries"] == 3 and len(desc["shards"]) == 4
    peek = client.get(f"/streams/ev/entries?shard={shard}&from=1&limit=5").json()
    assert [e["value"] for e in peek["entries"]] == [{"a": 2}, {"base64": "AGJpbg=="}]
    assert peek["next"] == 3
    # A JSON value is handed out as stored: no float conversion, duplicate keys kept.
    exact = client.post("/streams/exact", content=b'{"n":123456789012345678901234567890,"k":1,"k":2}',
                        headers={"content-type": "application/json"}).json()
    raw = client.get(f"/streams/exact/entries?shard={exact['shard']}").content
    assert b'"value":{"n":123456789012345678901234567890,"k":1,"k":2}' in raw
    assert_error(client.get("/streams/ev/entries?limit=100000"), 400, "bad_parameter")
    assert_error(client.get("/streams/ev/entries?shard=9"), 400, "bad_parameter")
    assert_error(client.get("/streams/nope"), 404, "unknown_stream")
    assert_error(client.get("/nothing"), 404, "not_found")
    assert client.get("/openapi.json").json()["openapi"] == "3.1.0"


def test_metrics_parse_and_count(client: TestClient) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    for i in range(7):
        client.post("/streams/m", content=b'[{"a": 1}, {"a": 2}, {"a": 3}]', headers=JSON)
    client.post("/streams/m", content=b"oops", headers=JSON)
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    appended = [s for s in families["comet_stream_appended_entries"].samples if s.labels["stream"] == "m"]
    assert appended[0].value == 21
    codes = {s.labels["code"]: s.value for s in families["comet_http_requests"].samples}
    assert codes["202"] == 7 and codes["400"] == 1
    accepted = sum(s.value for s in families["comet_http_events_accepted"].samples)
    assert accepted == 21
    counts = {s.labels["class"]: s.value for s in families["comet_http_request_duration_seconds"].samples
              if s.name.endswith("_count") and s.labels["route"] == "/streams/{name}"
              and s.labels["method"] == "POST"}
    assert counts == {"2xx": 7, "4xx": 1}


def test_a_store_that_would_wait_runs_off_the_event_loop(data_dir: Path) -> None:
    """The loop stores a body only with wait=False; an append that would first wait (the
    first segment, a chunk to grow, a rotation: file syncs that took up to a second on a
    busy disk) is made again, allowed to wait, on a thread, to the shard the refused call
    had chosen; every event is stored once, and the shards still take turns."""
    calls: list[tuple[int, bool, int | None]] = []
    event = b'{"pad":"' + b"p" * 990 + b'"}\n'
    with Log(data_dir, Config(shards=2, segment_bytes=1 << 20, segment_chunk_bytes=256 << 10)) as log:
        def work(wait: bool = True, shard: int | None = None) -> BatchResult:
            calls.append((threading.get_ident(), wait, shard))
            return log.ingest("s", event * 10, "ndjson", shard=shard, wait=wait)

        async def post_all() -> int:
            hops = ShardHops()
            for _ in range(600):  # ~6 MB over two shards: chunks and rotations
                await hops.store("s", partial(work), offload=False)
            return threading.get_ident()

        loop_thread = asyncio.run(post_all())
        stats = log.stats("s")
        assert stats.entries == 6000 and all(s.rotations >= 2 for s in stats.shards)
        assert [s.next_entry for s in stats.shards] == [3000, 3000]
        assert log.verify().ok
    waited = [(thread, shard) for thread, wait, shard in calls if wait]
    assert all(not wait and shard is None for thread, wait, shard in calls if thread == loop_thread)
    assert all(thread != loop_thread and shard in (0, 1) for thread, shard in waited)
    assert sum(s.rotations + 1 for s in stats.shards) <= len(waited) < 60
    assert len(calls) == 600 + len(waited)


@pytest.mark.parametrize("first_hop_fails", [False, True])
def test_requests_that_find_a_shard_waiting_share_one_thread(data_dir: Path,
                                                             first_hop_fails: bool) -> None:
    """A burst on a new stream finds each shard without a segment: one request per shard goes
    to a thread, the others wait for it and store on the loop; each event stored once.  A hop
    that fails answers its own request only: those waiting for it try again."""
    shards, burst = 4, 64
    hopped: list[int | None] = []
    with Log(data_dir, Config(shards=shards)) as log:
        log.open_stream("s", create=True)

        def work(n: int, wait: bool = True, shard: int | None = None) -> BatchResult:
            if wait:
                hopped.append(shard)
                if first_hop_fails and len(hopped) == 1:
                    raise SyncFailed("the first hop fails")
            return log.ingest("s", orjson.dumps({"n": n}), "json", shard=shard, wait=wait)

        async def burst_of_requests() -> list[BatchResult | BaseException]:
            hops = ShardHops()
            return await asyncio.gather(*(hops.store("s", partial(work, n), offload=False)
                                          for n in range(burst)), return_exceptions=True)

        results = asyncio.run(burst_of_requests())
        failed = [r for r in results if isinstance(r, BaseException)]
        assert len(failed) == (1 if first_hop_fails else 0)
        stored = sorted(orjson.loads(e.payload)["n"] for i in range(shards)
                        for e in log.read("s", i, 0, burst))
        assert stored == sorted(n for n, r in enumerate(results) if not isinstance(r, BaseException))
    assert 1 <= len(hopped) <= shards + (1 if first_hop_fails else 0), hopped


def test_a_new_streams_own_shards_take_their_first_event_on_the_loop(data_dir: Path) -> None:
    """A shard not open in this process refuses an append that may not wait; once
    open_shards opened the process's shards (the gateway does it on the thread that opens
    the stream), the first event of each goes in without waiting: its first segment is made
    then, nothing synced."""
    from storage_c import WouldBlock

    with Log(data_dir, Config(shards=4)) as log:
        log.open_stream("s", create=True)
        with pytest.raises(WouldBlock):
            log.ingest("s", b'{"n":0}', "json", shard=0, wait=False)
        assert log.open_shards("s") == [0, 1, 2, 3]
        for shard in range(4):
            assert log.ingest("s", b'{"n":1}', "json", shard=shard, wait=False).count == 1
        stats = log.stats("s")
        assert [s.segments for s in stats.shards] == [1, 1, 1, 1]
        assert sum(s.syncs for s in stats.shards) == 0
