"""Thousands of shards through a bounded number of open ones (storage_c lru.c):
a gateway whose workers may keep only a few shards open still stores every event
of many streams, lists and measures them without opening them, keeps its
descriptors bounded, and answers a request that finds every open shard in use
with 503 ``too_many_open_shards`` (never 500) that a retry gets through."""

from __future__ import annotations

import http.client
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import orjson

from storage_c import Config, Log, TooManyOpenShards

from .support.server import SMALL, GatewayProcess

STREAMS = 120
EVENTS = 3
BUDGET = 8


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def post_until_stored(port: int, stream: str, events: list[bytes]) -> list[int]:
    """Posts each event, retrying a 503 as a client would; the statuses seen."""
    seen: list[int] = []
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        for body in events:
            while True:
                conn.request("POST", f"/streams/{stream}", body=body,
                             headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                answer = resp.read()
                seen.append(resp.status)
                if resp.status == 202:
                    break
                assert resp.status == 503, (resp.status, answer)
                assert orjson.loads(answer)["error"] == "too_many_open_shards", answer
                assert resp.getheader("Retry-After"), answer
    finally:
        conn.close()
    return seen


def test_many_streams_through_a_few_open_shards(tmp_path: Path) -> None:
    env = {**SMALL, "COMET_STORAGE_MAX_OPEN_SHARDS": str(BUDGET), "COMET_MAX_STREAMS": "0"}
    sent = {f"svc-{i:03d}": [orjson.dumps({"svc": i, "n": n}) for n in range(EVENTS)]
            for i in range(STREAMS)}
    with GatewayProcess(tmp_path / "data", env=env) as server:
        server.wait_ready()
        pids = server.worker_pids()
        before = {pid: descriptors(pid) for pid in pids}
        with ThreadPoolExecutor(8) as pool:
            statuses = [s for seen in pool.map(lambda kv: post_until_stored(server.port, *kv),
                                                sent.items()) for s in seen]
        grown = {pid: descriptors(pid) - before[pid] for pid in pids}
        # BUDGET shards of at most 4 descriptors each, plus keep-alive sockets
        assert all(n <= BUDGET * 4 + 16 for n in grown.values()), grown
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        conn.request("GET", "/streams")
        resp = conn.getresponse()
        listing = orjson.loads(resp.read())
        assert resp.status == 200, listing
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        assert resp.status == 200 and b"comet_stream_appended_entries_total" in resp.read()
        conn.close()
        after = {pid: descriptors(pid) - before[pid] for pid in pids}
        assert all(n <= BUDGET * 4 + 16 for n in after.values()), after  # listing opened nothing
        server.stop()
    assert statuses.count(202) == STREAMS * EVENTS
    names = {s["name"] if isinstance(s, dict) else s for s in listing["streams"]}
    assert set(sent) <= names
    with Log(tmp_path / "data", Config(background_flush=False, max_open_shards=BUDGET)) as log:
        for name, events in sent.items():
            stored = [bytes(p) for shard in range(log.shard_count(name))
                      for batch in log.iter_entries(name, shard) for p in batch.payloads]
            assert sorted(stored) == sorted(events), name
            assert log.stats(name).entries == EVENTS


def test_stats_without_the_oldest_timestamp_are_the_same_otherwise(tmp_path: Path) -> None:
    """What a listing and /metrics read (oldest=False), of a shard open and of one closed."""
    with Log(tmp_path / "d", Config(max_open_shards=1, shards=2)) as log:
        log.append_batch("a", [b"x", b"y"], shard=0)
        log.append("b", b"z", shard=1)   # closes a's shard to open b's
        for name in ("a", "b"):
            full, brief = log.stats(name), log.stats(name, oldest=False)
            assert full.oldest_timestamp > 0 and brief.oldest_timestamp == 0
            assert [replace(s, oldest_timestamp=0) for s in full.shards] == brief.shards


def test_group_handles_outlive_their_shard_being_closed(tmp_path: Path) -> None:
    with Log(tmp_path / "d", Config(max_open_shards=1, shards=2)) as log:
        log.append("a", b"x", shard=0)
        group = log.group("a", 0, "g")
        log.append("b", b"y", shard=0)   # closes a's shard to open b's
        assert group.ack(0) == 1         # reopens a's under the handle (closing b's)
        assert group.offset == 1
        assert [bytes(p) for b in log.iter_entries("b", 0) for p in b.payloads] == [b"y"]


def test_the_refusal_is_a_503_that_names_the_budget() -> None:
    from gateway.errors import mapping_of
    answer = mapping_of(TooManyOpenShards("all 8 open shards of this process are in use"))
    assert (answer.status, answer.code, answer.retry) == (503, "too_many_open_shards", True)
