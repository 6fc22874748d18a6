"""gateway/client.py, the producer's client: against a real `comet serve` (its answers, a
lost answer, kill -9 and HUP under load) and against a scripted HTTP server (its retry
rules: Retry-After, resets, timeouts, the statuses it never retries).

test_lost_answer_is_replayed_not_stored_twice and the kill -9 test need the gateway's
Idempotency-Key support (a retry of a stored batch gets the first answer again)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import pytest

from gateway.client import CometClient, CometHTTPError, CometRetriesExhausted, PostResult
from spark_jobs.lake.read import read_table
from spark_jobs.lake.lakefs import Lake
from spark_jobs.spark.ship import ShipOptions, ship
from storage_c import Log

from .support.docs import code_blocks
from .support.faulty_load import Havoc
from .support.lake import check_exactly_once
from .support.flaky_http import OK, DroppingProxy, ScriptedServer, Step
from .support.noloss import READ_CONFIG, Acks, check, merged
from .support.server import SMALL, GatewayProcess

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# The full run: 100,000 events in 20,000 batches of 5 from 8 producers, 20-50 s on 2 cores
# (a kill about every second: some 15 kills and 5 HUPs); COMET_CLIENT_EVENTS for fewer.
CHAOS_EVENTS = int(os.environ.get("COMET_CLIENT_EVENTS", "100000"))
CHAOS_BATCH = 5
CHAOS_PRODUCERS = 8
# Each 202 waits for its batch's sync: a kill then often falls between a batch stored and its
# answer sent, the case a retry must not store twice (some 30 replays a run; with "interval"
# some runs had none).
CHAOS_ENV = {**SMALL, "COMET_STORAGE_DURABILITY": "always"}
CLIENT_PAGE = Path(__file__).resolve().parent.parent / "docs" / "client.md"


def stored(data_dir: Path, res: PostResult) -> list[bytes]:
    with Log(data_dir, READ_CONFIG) as log:
        batch = log.read(res.stream, res.shard, res.first, res.count + 1)
        return [p for e, p in zip(batch.entries, batch.payloads) if e <= res.last]


def numbered(producer: str, batch: int, size: int) -> list[dict[str, object]]:
    """Events as tests/support/noloss.py reads them: producer, event number, request."""
    return [{"c": producer, "i": batch * size + k, "r": f"{producer}.{batch}"} for k in range(size)]


def acknowledge(acks: Acks, res: PostResult, rid: str, base: int) -> None:
    acks.acknowledged(res.stream, res.shard, res.first, res.count, rid, None, base)


def test_posts_lists_and_bytes_and_raises_the_gateways_detail(data_dir: Path) -> None:
    with GatewayProcess(data_dir, env=SMALL) as server, CometClient(server.url) as client:
        server.wait_ready()
        events = [{"t": 1}, {"t": 2, "s": "é"}, [3]]
        res = client.post("ev", events)
        assert (res.stream, res.count, res.last - res.first + 1) == ("ev", 3, 3)
        assert not res.replayed and res.attempts == 1
        assert len(res.idempotency_key) == 32 and int(res.idempotency_key, 16) >= 0
        assert [orjson.loads(p) for p in stored(data_dir, res)] == events

        blob = b"\x00 opaque \xff"
        res = client.post("blobs", blob, content_type="application/octet-stream")
        assert res.count == 1 and stored(data_dir, res) == [blob]

        keyed = [client.post("ev", b'{"k":1}\n{"k":2}\n', key="device-7") for _ in range(3)]
        with Log(data_dir, READ_CONFIG) as log:
            assert {r.shard for r in keyed} == {log.shard_for_key("ev", "device-7")}
        assert len({r.idempotency_key for r in keyed}) == 3  # a fresh key per call

        with pytest.raises(CometHTTPError) as bad:
            client.post("ev", b'{"t":1}\n{"t":2,}\n')
        assert (bad.value.status, bad.value.code) == (400, "invalid_json")
        assert "event 1 (line 2) is not valid JSON" in bad.value.detail
        with pytest.raises(CometHTTPError) as name:
            client.post("bad name", [{}])
        assert (name.value.status, name.value.code) == (400, "invalid_stream_name")
        assert "contains byte 0x20" in str(name.value)
        with pytest.raises(ValueError):
            client.post("ev", [{}], content_type="application/json")
        assert server.stop() == 0


def test_token_is_sent(data_dir: Path) -> None:
    with GatewayProcess(data_dir, env={**SMALL, "COMET_AUTH": "on", "COMET_TOKENS": "t0ken-t0ken"}) as server:
        server.wait_ready()
        with CometClient(server.url, "t0ken-t0ken") as client:
            assert client.post("ev", [{"a": 1}]).count == 1
        with CometClient(server.url, "wrong") as client, pytest.raises(CometHTTPError) as no:
            client.post("ev", [{"a": 1}])
        assert no.value.status == 403 and no.value.code == "forbidden"
        assert server.stop() == 0


def test_the_client_needs_only_the_standard_library() -> None:
    """Without orjson too: what importing the client loads is the standard library's."""
    probe = ("import json, sys\n"
             "sys.modules['orjson'] = None  # as if not installed\n"
             "before = set(sys.modules)\n"
             "import gateway.client as c\n"
             "extra = [m for m in set(sys.modules) - before if m.split('.')[0] not in "
             "sys.stdlib_module_names and m not in ('gateway', 'gateway.client')]\n"
             "print(json.dumps([c._encode({'\u00e9': [1, None]}).decode(), sorted(extra)]))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                         cwd=CLIENT_PAGE.parent.parent)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == ['{"\u00e9":[1,null]}', []]


def test_the_docs_example_runs_as_written(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    [example] = code_blocks(CLIENT_PAGE, "## Example")
    assert "http://localhost:8080" in example
    with GatewayProcess(data_dir, env=SMALL) as server:
        server.wait_ready()
        exec(compile(example.replace("http://localhost:8080", server.url), str(CLIENT_PAGE), "exec"), {})
        assert server.stop() == 0
    first, refused = capsys.readouterr().out.splitlines()
    assert first.startswith("events ") and first.endswith(" 2 False 1")
    assert refused.startswith("400 invalid_json event 0 (line 1) is not valid JSON")


@pytest.mark.parametrize("first", [
    Step(503, {"Retry-After": "1"}, b'{"error":"draining","detail":"shutting down"}'),
    Step(429, {"Retry-After": "1"}, b'{"error":"busy","detail":"in-flight budget spent"}'),
    Step(409, {"Retry-After": "1"}, b'{"error":"idempotency_key_in_flight","detail":"wait"}'),
    Step(507, {"Retry-After": "1"}, b'{"error":"storage_full","detail":"retention may delete nothing"}'),
], ids=["503", "429", "409-in-flight", "507"])
def test_retry_after_is_honoured_with_the_same_key(first: Step) -> None:
    with ScriptedServer([first, OK]) as fake, CometClient(fake.url) as client:
        t0 = time.monotonic()
        res = client.post("s", [{"a": 1}, {"a": 2}])
        took = time.monotonic() - t0
        assert res.attempts == 2 and (res.shard, res.first, res.last, res.count) == (3, 10, 11, 2)
        keys = fake.keys()
        assert len(keys) == 2 and keys[0] == keys[1] == res.idempotency_key
        assert fake.seen[0].body == fake.seen[1].body == b'{"a":1}\n{"a":2}'
        waited = fake.seen[1].at - fake.seen[0].at
        assert 1.0 <= waited and took < 3.0, (waited, took)


def test_without_retry_after_the_backoff_applies() -> None:
    """A proxy's 502 (no Retry-After, not JSON): retried after the first backoff, 0.05-0.1 s."""
    with ScriptedServer([Step(502, {"Content-Type": "text/html"}, b"<h1>bad gateway</h1>"), OK]) as fake, \
            CometClient(fake.url) as client:
        res = client.post("s", [{"a": 1}])
        waited = fake.seen[1].at - fake.seen[0].at
        assert res.attempts == 2 and 0.05 <= waited < 0.5, waited
        assert fake.keys()[0] == fake.keys()[1] == res.idempotency_key


def test_a_reset_is_retried_with_the_same_key() -> None:
    with ScriptedServer([Step(reset=True), Step(reset=True), OK]) as fake, \
            CometClient(fake.url) as client:
        res = client.post("s", [{"a": 1}], idempotency_key="batch-0001")
        assert res.attempts == 3 and fake.keys() == ["batch-0001"] * 3
        assert res.idempotency_key == "batch-0001"


def test_a_timeout_is_retried_with_the_same_key() -> None:
    with ScriptedServer([Step(hang=True), OK]) as fake, \
            CometClient(fake.url, timeout=0.5) as client:
        t0 = time.monotonic()
        res = client.post("s", [{"a": 1}])
        assert res.attempts == 2 and time.monotonic() - t0 >= 0.5
        keys = fake.keys()
        assert len(keys) == 2 and keys[0] == keys[1] == res.idempotency_key


def test_giving_up_says_what_failed_and_names_the_key() -> None:
    busy = Step(503, {"Retry-After": "0"}, b'{"error":"storage_gone","detail":"shard 3 gone"}')
    with ScriptedServer([busy]) as fake, CometClient(fake.url, max_attempts=3) as client:
        with pytest.raises(CometRetriesExhausted) as out:
            client.post("s", [{"a": 1}], idempotency_key="k-77")
        assert len(fake.seen) == 3 and out.value.attempts == 3
        text = str(out.value)
        assert "503 storage_gone: shard 3 gone" in text and "may or may not be stored" in text
        assert "'k-77'" in text and out.value.idempotency_key == "k-77"
    # the time budget ends the retries too: a wait past max_retry_s is not begun
    with ScriptedServer([Step(429, {"Retry-After": "30"}, b"{}")]) as fake, \
            CometClient(fake.url, max_retry_s=5) as client:
        t0 = time.monotonic()
        with pytest.raises(CometRetriesExhausted, match="429"):
            client.post("s", [{"a": 1}])
        assert len(fake.seen) == 1 and time.monotonic() - t0 < 5


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 413, 415, 422, 500])
def test_answers_no_retry_can_change_are_raised_at_once(status: int) -> None:
    answer = Step(status, {"Retry-After": "1"}, b'{"error":"some_code","detail":"why not"}')
    with ScriptedServer([answer, OK]) as fake, CometClient(fake.url) as client:
        with pytest.raises(CometHTTPError) as out:
            client.post("s", [{"a": 1}])
        assert (out.value.status, out.value.code, out.value.detail) == (status, "some_code", "why not")
        assert len(fake.seen) == 1


def test_lost_answer_is_replayed_not_stored_twice(data_dir: Path) -> None:
    """The gateway stores the batch and answers; the answer is lost on the way (the proxy
    resets the connection): the retry, with the same key, gets the first answer again."""
    with GatewayProcess(data_dir, env=SMALL) as server:
        server.wait_ready()
        with DroppingProxy(server.port, drop=1) as proxy, CometClient(proxy.url) as client:
            events = numbered("lost", 0, 5)
            res = client.post("ev", events)
            assert proxy.dropped == 1 and res.attempts == 2
            assert res.replayed, "the retry was stored again instead of answered from the first"
        acks = Acks()
        acknowledge(acks, res, "lost.0", 0)
        assert server.stop() == 0
    report = check(data_dir, acks, exact=True)
    assert report.ok and report.stored_events == 5, (report.problems, report.examples[:5])


@dataclass
class Producer:
    """Posts its share of the numbered batches through a client of its own."""

    name: str
    acks: Acks = field(default_factory=Acks)
    results: list[PostResult] = field(default_factory=list)
    error: BaseException | None = None

    def run(self, url: str, batches: range) -> None:
        try:
            with CometClient(url, max_attempts=100, max_retry_s=120) as client:
                for b in batches:
                    res = client.post("ev", numbered(self.name, b, CHAOS_BATCH))
                    acknowledge(self.acks, res, f"{self.name}.{b}", b * CHAOS_BATCH)
                    self.results.append(res)
        except BaseException as exc:  # the test reports it
            self.error = exc


@pytest.mark.slow
def test_exactly_once_through_kill_9_and_hup(data_dir: Path, spark: SparkSession,
                                             tmp_path: Path) -> None:
    """Producers post CHAOS_EVENTS numbered events while workers are killed with SIGKILL
    and the master gets HUPs: every event is stored, and stored once; then spark-ship
    writes the stream into a Delta table, where every event is once too."""
    batches = CHAOS_EVENTS // CHAOS_BATCH
    t0 = time.monotonic()
    producers = [Producer(f"p{k}") for k in range(CHAOS_PRODUCERS)]
    with GatewayProcess(data_dir, env=CHAOS_ENV) as server:
        server.wait_ready()
        havoc = Havoc(server, every_s=1.0, hup_every=4)
        threads = [threading.Thread(target=p.run, args=(server.url, range(k, batches, CHAOS_PRODUCERS)))
                   for k, p in enumerate(producers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=180)
        havoc.stop()
        assert not any(t.is_alive() for t in threads)
        assert not [p.error for p in producers if p.error], [p.error for p in producers]
        server.wait_ready()
        assert server.stop() == 0
    took = time.monotonic() - t0
    every = [r for p in producers for r in p.results]
    retried = sum(r.attempts > 1 for r in every)
    assert len(every) == batches and len(havoc.killed) >= 2 and havoc.hups >= 1, \
        (len(every), havoc.killed, havoc.hups)
    assert retried > 0, "no request met a fault: the test tested nothing"
    report = check(data_dir, merged(producers), exact=True)
    summary = (f"{CHAOS_EVENTS} events in {took:.1f} s, {len(havoc.killed)} kills, "
               f"{havoc.hups} HUPs, {retried} batches retried, "
               f"{sum(r.replayed for r in every)} replayed")
    assert report.ok and report.stored_events == CHAOS_EVENTS, \
        (summary, report.problems, report.examples[:5])
    lake = Lake(str(tmp_path / "lake"))
    shipped = ship(ShipOptions(str(data_dir), "ev", lake), lambda: spark)
    check_exactly_once(lake, data_dir, "ev", READ_CONFIG)
    rows = read_table(lake, "ev")
    events = Counter(zip(rows.column("c").to_pylist(), rows.column("i").to_pylist()))
    wanted = {(f"p{k}", b * CHAOS_BATCH + j) for k in range(CHAOS_PRODUCERS)
              for b in range(k, batches, CHAOS_PRODUCERS) for j in range(CHAOS_BATCH)}
    assert set(events) == wanted and set(events.values()) == {1}, (
        f"{summary}: in the lake {len(events)} distinct events of {CHAOS_EVENTS}, "
        f"{sum(n > 1 for n in events.values())} more than once")
    print(f"{summary}; {shipped.rows} rows in the Delta table")
