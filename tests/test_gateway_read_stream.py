"""Reading a whole stream back over HTTP: GET /streams/{name}/entries without
``shard`` merges every shard in entry-time order, a page at a time, and its
cursor resumes exactly where a page stopped - no entry twice, none missed,
even while events keep arriving.  ``shard=N`` still reads one shard."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import orjson
import pytest
from starlette.testclient import TestClient

from gateway.app import create_app
from storage_c import Config, Log

from .support.gateway_app import JSON, config
from .support.server import SMALL, GatewayProcess

Page = dict[str, Any]


def read_all_pages(get: Any, stream: str, limit: int) -> list[Page]:
    """Every page of ``stream``, following the cursor until a page comes back empty."""
    pages = []
    cursor = None
    for _ in range(1000):
        query = f"limit={limit}" + (f"&cursor={cursor}" if cursor else "")
        status, page = get(f"/streams/{stream}/entries?{query}")
        assert status == 200, page
        pages.append(page)
        if not page["entries"]:
            return pages
        cursor = page["next"]
    raise AssertionError(f"no end after {len(pages)} pages")


def test_a_stream_over_two_workers_reads_back_once_in_time_order(tmp_path: Path) -> None:
    with GatewayProcess(tmp_path / "data", workers=2, env=SMALL) as server:
        server.wait_ready()
        sent = []
        for i in range(40):
            status, body, _ = server.request("POST", "/streams/blobs", orjson.dumps({"i": i}), JSON)
            assert status == 202, body
            sent.append(orjson.loads(body))
        assert len({a["shard"] for a in sent}) > 2  # the events are spread over shards

        def get(path: str) -> tuple[int, Page]:
            status, body, _ = server.request("GET", path)
            return status, orjson.loads(body)

        pages = read_all_pages(get, "blobs", limit=7)
        assert server.stop() == 0
    entries = [e for page in pages for e in page["entries"]]
    assert [e["value"]["i"] for e in entries] == list(range(40))  # each once, in posting order
    keys = [(e["timestamp"], e["shard"], e["entry"]) for e in entries]
    assert keys == sorted(keys)
    assert [(e["shard"], e["entry"]) for e in entries] == [(a["shard"], a["first"]) for a in sent]
    assert all(e["id"] == f"{e['shard']}-{e['entry']}" for e in entries)
    assert [len(p["entries"]) for p in pages] == [7] * 5 + [5, 0]
    assert all(p["skipped"] == 0 for p in pages)


def test_paging_while_events_arrive_returns_each_once(data_dir: Path) -> None:
    """Two threads append to every shard while pages are read: each page read
    lets each of them append ten more, so appends land between and during reads."""
    storage = Config(shards=4, segment_bytes=1 << 20)
    per_writer = 300
    app = create_app(config(data_dir, storage=storage))
    with TestClient(app) as c:
        c.post("/streams/ev", content=b'{"w": 0, "i": -1}', headers=JSON)
        page_read = threading.Semaphore(0)

        def writer(w: int) -> None:
            with Log(data_dir, storage) as log:
                for i in range(per_writer):
                    if i % 10 == 0:
                        assert page_read.acquire(timeout=60)
                    log.append("ev", orjson.dumps({"w": w, "i": i}), shard=(w + i) % 4)

        threads = [threading.Thread(target=writer, args=(w,)) for w in (1, 2)]
        for t in threads:
            t.start()
        seen: list[dict[str, Any]] = []
        cursor: dict[str, str] = {}
        for _ in range(10_000):
            page = c.get("/streams/ev/entries", params={"limit": 5, **cursor}).json()
            page_read.release(2)
            seen += page["entries"]
            cursor = {"cursor": page["next"]}
            if len(seen) >= 1 + 2 * per_writer and not page["entries"]:
                break
        for t in threads:
            t.join()
    ids = [(e["shard"], e["entry"]) for e in seen]
    assert len(ids) == len(set(ids)), "an entry came twice"
    values = sorted((e["value"]["w"], e["value"]["i"]) for e in seen)
    assert values == [(0, -1)] + [(w, i) for w in (1, 2) for i in range(per_writer)], \
        "an entry was missed"
    for shard in range(4):  # each shard's entries come in entry order
        mine = [entry for s, entry in ids if s == shard]
        assert mine == sorted(mine)


def test_one_shard_is_read_as_before(data_dir: Path) -> None:
    with TestClient(create_app(config(data_dir))) as c:
        a = c.post("/streams/ev?key=k", content=b"[1, 2, 3]", headers=JSON).json()
        page = c.get(f"/streams/ev/entries?shard={a['shard']}&from=1&limit=5").json()
        assert page["shard"] == a["shard"] and page["next"] == 3
        assert [(e["shard"], e["entry"], e["value"]) for e in page["entries"]] == \
            [(a["shard"], 1, 2), (a["shard"], 2, 3)]


@pytest.mark.parametrize("query,message", [
    ("cursor=nonsense!", "cursor is not one this gateway handed out"),
    ("cursor=" + "A" * 12, "cursor is not one this gateway handed out"),
    ("cursor=WyJvdGhlciIsWzAsMCwwLDBdXQ", "cursor is one of stream 'other', not of 'ev'"),
    ("cursor=WyJldiIsWzAsMF1d", "cursor does not fit stream 'ev' as it is now"),
    ("cursor=WyJldiIsWzk5LDAsMCwwXV0", "cursor does not fit stream 'ev' as it is now"),
    ("cursor=WyJldiIsWy0xLDAsMCwwXV0", "cursor is not one this gateway handed out"),
    ("from=3", "from is an entry number of one shard: give shard too"),
    ("shard=0&cursor=x", "give cursor (to read the whole stream on) or shard and from"),
    ("limit=0", "limit must be between 1 and 1000"),
])
def test_a_bad_cursor_or_parameter_is_400(data_dir: Path, query: str, message: str) -> None:
    with TestClient(create_app(config(data_dir))) as c:
        c.post("/streams/ev", content=b"[1, 2]", headers=JSON)
        r = c.get(f"/streams/ev/entries?{query}")
        assert r.status_code == 400, r.text
        assert r.json()["error"] in ("bad_cursor", "bad_parameter")
        assert message in r.json()["detail"]
        whole = c.get("/streams/ev/entries").json()  # nothing changed
        assert [e["value"] for e in whole["entries"]] == [1, 2]
