"""The tail in /metrics: the request duration histogram by route, method and
status class, summed over the workers of a real `comet serve`, and the
worst stalls of the last minute (gateway/metrics.py, gateway/stalls.py)."""

from __future__ import annotations

import http.client
import json
import logging
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from gateway import metrics
from gateway.app import create_app
from storage_c import Config, Log
from gateway.metrics import BUCKETS, STALL_WINDOW_S, WorkerMetrics, worst_stalls
from gateway.routes import LAYOUT

from .support.gateway_app import config
from .support.server import HOST, SMALL, GatewayProcess

HIST = "comet_http_request_duration_seconds"
JSON = {"content-type": "application/json"}
Key = tuple[str, str, str]  # method, route, class


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def histogram(text: str) -> dict[Key, dict[str, float]]:
    """Each series of the histogram: its samples by "le" (buckets), "sum" and "count",
    after checking its shape: the fixed labels, every bucket, cumulative, +Inf == count."""
    series: dict[Key, dict[str, float]] = {}
    for sample in families(text)[HIST].samples:
        labels = dict(sample.labels)
        le = labels.pop("le", None)
        assert set(labels) == {"method", "route", "class"}, labels  # never a stream
        key = (labels["method"], labels["route"], labels["class"])
        assert key[0] in metrics.METHODS and key[1] in LAYOUT.routes and key[2] in metrics.CLASSES
        name = sample.name.removeprefix(HIST + "_")
        series.setdefault(key, {})["le " + le if name == "bucket" and le else name] = sample.value
    expected_les = [f"le {float(b)}" for b in BUCKETS] + ["le +Inf"]
    for key, values in series.items():
        les = [k for k in values if k.startswith("le ")]
        assert [f"le {float(k[3:])}" if k != "le +Inf" else k for k in les] == expected_les, key
        cumulative = [values[k] for k in les]
        assert cumulative == sorted(cumulative), f"{key}: buckets not cumulative: {cumulative}"
        assert values["le +Inf"] == values["count"], key
    return series


def counts(text: str) -> dict[Key, int]:
    return {key: int(values["count"]) for key, values in histogram(text).items()}


def delta(after: dict[Key, int], before: dict[Key, int]) -> dict[Key, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def pinned_connections(server: GatewayProcess) -> tuple[dict[int, http.client.HTTPConnection], int]:
    """A keep-alive connection to each worker (by the slot its /readyz names),
    and how many /readyz requests finding them took."""
    pinned: dict[int, http.client.HTTPConnection] = {}
    asked = 0
    while len(pinned) < server.workers:
        assert asked < 500, f"connections reached only the workers of slots {sorted(pinned)}"
        conn = server.connection()
        conn.request("GET", "/readyz")
        response = conn.getresponse()
        slot = json.loads(response.read())["slot"]
        asked += 1
        if slot in pinned:
            conn.close()
        else:
            pinned[slot] = conn
    return pinned, asked


def ask(conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None = None,
        headers: dict[str, str] | None = None) -> int:
    conn.request(method, path, body=body, headers=headers or {})
    response = conn.getresponse()
    response.read()
    return response.status


# what each worker is asked, and the series each request counts in
MIX: list[tuple[str, str, bytes | None, dict[str, str], int, Key]] = [
    ("POST", "/streams/t{slot}-{i}", b'{"a":1}', JSON, 202, ("POST", "/streams/{name}", "2xx")),
    ("POST", "/streams/t{slot}-{i}", b"[{},{}]", JSON, 202, ("POST", "/streams/{name}", "2xx")),
    ("POST", "/streams/t{slot}-{i}", b"oops", JSON, 400, ("POST", "/streams/{name}", "4xx")),
    ("GET", "/streams/t{slot}-0", None, {}, 200, ("GET", "/streams/{name}", "2xx")),
    ("GET", "/streams/t{slot}-0/entries?limit=100000", None, {}, 400,
     ("GET", "/streams/{name}/entries", "4xx")),
    ("PATCH", "/streams/t{slot}-0", b"", {}, 405, ("other", "/streams/{name}", "4xx")),
    ("GET", "/nothing/here", None, {}, 404, ("GET", "unmatched", "4xx")),
    ("POST", "/v1/logs", b"x", {"content-type": "text/plain"}, 415, ("POST", "/v1/logs", "4xx")),
    ("HEAD", "/healthz", None, {}, 200, ("HEAD", "/healthz", "2xx")),
    ("GET", "/openapi.json", None, {}, 200, ("GET", "/openapi.json", "2xx")),
]


@pytest.fixture
def server(data_dir: Path) -> Iterator[GatewayProcess]:
    with GatewayProcess(data_dir, workers=2, env=SMALL) as gateway:
        gateway.wait_ready()
        yield gateway
        assert gateway.stop() == 0


def scrape(server: GatewayProcess) -> str:
    status, body, _ = server.request("GET", "/metrics")
    assert status == 200
    return body.decode()


def settled_scrape(server: GatewayProcess) -> str:
    """A scrape once the requests before it are all counted (a request is counted once its
    answer went out: the last /readyz of wait_ready may be counted after the next scrape on
    a busy machine): the one after which only the scrape before it was counted."""
    text, scrapes = scrape(server), 1
    while True:
        time.sleep(0.05)
        again, scrapes = scrape(server), scrapes + 1
        moved = delta(counts(again), counts(text))
        if moved.pop(("GET", "/metrics", "2xx"), 0) == 1 and not moved:  # just the scrape before
            return again
        assert scrapes < 100, f"still counting {moved}"
        text = again


def test_the_histogram_counts_every_request_of_both_workers(server: GatewayProcess) -> None:
    base_text = settled_scrape(server)
    base, base_ingest = counts(base_text), ingest_by_slot(base_text)
    pinned, asked = pinned_connections(server)
    expected: dict[Key, int] = {("GET", "/readyz", "2xx"): asked}
    for slot, conn in pinned.items():
        for i, (method, path, body, headers, status, key) in enumerate(MIX):
            # a stream per request: the histogram has no more series for more streams
            assert ask(conn, method, path.format(slot=slot, i=i), body, headers) == status, path
            expected[key] = expected.get(key, 0) + 1
        conn.close()
    scrapes = 1  # the first scrape counts too, once it has answered
    deadline = time.monotonic() + 30
    while True:  # until the last answers are counted (a scrape may land on the other worker first)
        text = scrape(server)
        got = delta(counts(text), base)
        want = {**expected, ("GET", "/metrics", "2xx"): scrapes}
        if got == want:
            break
        assert all(got.get(k, 0) <= n for k, n in want.items()) and set(got) <= set(want), \
            f"counted more than was asked: {got} against {want}"
        assert time.monotonic() < deadline, f"still {got} against {want}"
        scrapes += 1
        time.sleep(0.02)
    # both workers answered their share, and the histogram holds both shares
    ingest = ingest_by_slot(text)
    assert {slot: ingest[slot] - base_ingest.get(slot, 0) for slot in ingest} == {0: 4, 1: 4}
    assert got[("POST", "/streams/{name}", "2xx")] == 4 and got[("POST", "/streams/{name}", "4xx")] == 2


def ingest_by_slot(text: str) -> dict[int, int]:
    """Ingest answers per worker (comet_http_requests_total, all codes)."""
    out: dict[int, int] = {}
    for sample in families(text)["comet_http_requests"].samples:
        out[int(sample.labels["slot"])] = out.get(int(sample.labels["slot"]), 0) + int(sample.value)
    return out


def stalls(text: str, name: str) -> dict[int, float]:
    return {int(s.labels["slot"]): s.value for s in families(text)[name].samples}


def test_a_stopped_worker_shows_as_a_stall(server: GatewayProcess) -> None:
    """SIGSTOP blocks a worker's loop for real: the loop monitor wakes that late."""
    victim = server.worker_pids()[0]
    os.kill(victim, signal.SIGSTOP)
    try:
        time.sleep(1.0)  # the stall being measured (far above what a busy machine causes)
    finally:
        os.kill(victim, signal.SIGCONT)
    deadline = time.monotonic() + 30
    while True:  # until the woken worker's monitor has noted it
        seen = stalls(scrape(server), "comet_event_loop_stall_max_seconds")
        if max(seen.values()) >= 0.95:
            break
        assert time.monotonic() < deadline, f"no stall of 1 s seen: {seen}"
        time.sleep(0.02)
    assert sorted(seen) == [0, 1]
    assert sorted(v >= 0.95 for v in seen.values()) == [False, True], seen  # that worker only


def test_a_slow_request_shows_as_the_longest_and_in_its_bucket(server: GatewayProcess) -> None:
    """A client that sends half its body and the rest 0.3 s later: a 0.3 s request."""
    body = b'{"slow": true}'
    with socket.create_connection((HOST, server.port), timeout=10) as sock:
        sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
        slot = json.loads(read_response(sock)[1])["slot"]
        sock.sendall(b"POST /streams/slow HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body[:5])
        time.sleep(0.3)  # the slowness being measured
        sock.sendall(body[5:])
        assert read_response(sock)[0] == 202
    deadline = time.monotonic() + 30
    while True:
        text = scrape(server)
        longest = stalls(text, "comet_http_request_max_seconds")
        if longest.get(slot, 0) >= 0.3:
            break
        assert time.monotonic() < deadline, f"no request of 0.3 s in slot {slot}: {longest}"
        time.sleep(0.02)
    posts = histogram(text)[("POST", "/streams/{name}", "2xx")]
    assert posts["count"] == 1 and posts["sum"] >= 0.3, posts
    # in the first bucket whose bound is at least its duration, and in none below
    bounds = [float(k[3:]) for k in posts if k.startswith("le ") and k != "le +Inf"]
    inside = [b for b in bounds if posts[f"le {b}"] == 1]
    assert all(b < posts["sum"] for b in bounds if b not in inside), posts
    assert not inside or inside[0] >= posts["sum"], posts
    assert posts["le 0.25"] == 0, posts


def read_response(sock: socket.socket) -> tuple[int, bytes]:
    """One HTTP/1.1 response with a Content-Length: (status, body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "connection closed"
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed"
        rest += chunk
    return int(head.split(b" ", 2)[1]), rest[:length]


def test_classes_buckets_and_the_stall_window(data_dir: Path) -> None:
    """In one process: every class, a bound counts in its own bucket (le is <=), a
    duration above the last bucket only in +Inf, and a stall is reported for
    STALL_WINDOW_S seconds, not after."""
    w = WorkerMetrics.open(data_dir, 0, LAYOUT)
    series = LAYOUT.series_of("/streams/{name}", "DELETE")
    for status, seconds in [(101, 0.001), (204, 0.0005), (302, 0.0006), (404, 11.0), (503, 10.0),
                            (599, 0.1)]:
        w.request(series, status, seconds)
    w.tick(0.2, now=1000.5)
    w.tick(0.05, now=1001.2)
    w.close()
    with Log(data_dir, Config(background_flush=False)) as log:
        text = metrics.render(log, data_dir, LAYOUT)
    got = {key[2]: values for key, values in histogram(text).items()
           if key[:2] == ("DELETE", "/streams/{name}")}
    assert {cls: v["count"] for cls, v in got.items()} == {"1xx": 1, "2xx": 1, "3xx": 1,
                                                          "4xx": 1, "5xx": 2}
    assert got["2xx"]["le 0.0005"] == 1 and got["3xx"]["le 0.0005"] == 0
    assert got["3xx"]["le 0.001"] == 1
    assert got["4xx"]["le 10.0"] == 0 and got["4xx"]["le +Inf"] == 1
    assert got["5xx"]["le 10.0"] == 2 and got["5xx"]["le 0.1"] == 1
    assert got["4xx"]["sum"] == pytest.approx(11.0)
    words = metrics.read_all_workers(data_dir, LAYOUT)[0]
    assert worst_stalls(words, now=1001.9) == (200_000_000, 11_000_000_000)
    assert worst_stalls(words, now=1000 + STALL_WINDOW_S - 0.5) == (200_000_000, 11_000_000_000)
    assert worst_stalls(words, now=1000 + STALL_WINDOW_S + 0.5) == (50_000_000, 0)
    assert worst_stalls(words, now=1001 + STALL_WINDOW_S + 0.5) == (0, 0)


def test_per_stream_families_and_a_stream_deleted_while_listed(data_dir: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Every per-stream family names each listed stream once, parsed by the
    Prometheus client; a stream deleted between the listing and its statistics
    is left out (it was a 500)."""
    with Log(data_dir, Config(background_flush=False, shards=2)) as log:
        log.append("kept", b"x", shard=0)
        log.append("kept", b"y", shard=1)
        log.append("gone", b"z", shard=0)
        listed = log.streams()
        log.delete_stream("gone")
        monkeypatch.setattr(log, "streams", lambda: listed)
        text = metrics.render(log, data_dir, LAYOUT)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("comet_stream_appended_entries", "comet_stream_entries",
                 "comet_append_latency_max_seconds", "comet_stream_disk_bytes"):
        assert [s.labels["stream"] for s in families[name].samples
                if not s.name.endswith("_created")] == ["kept"], name
    entries = [s.value for s in families["comet_stream_entries"].samples]
    assert entries == [2]
    assert 'stream="gone"' not in text


def test_a_bug_is_answered_500_and_counted_as_5xx(data_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """An unexpected exception on an ingest path or another route: a JSON 500 with
    a log line naming it, counted in the histogram like any answer."""
    from gateway import ingest, otlp, reads

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug")

    for module, name in [(ingest, "decode_and_store"), (otlp, "decode"), (reads, "list_streams")]:
        monkeypatch.setattr(module, name, broken)
    with TestClient(create_app(config(data_dir))) as c, caplog.at_level(logging.ERROR):
        answers = [c.post("/streams/s", content=b"{}", headers=JSON),
                   c.post("/v1/logs", content=b"{}", headers=JSON), c.get("/streams")]
        assert [(r.status_code, r.headers["content-type"]) for r in answers] == \
            [(500, "application/json")] * 3
        assert answers[0].json()["error"] == answers[2].json()["error"] == "internal"
        assert answers[1].json()["message"] == "unexpected error; see the gateway's log"
        text = c.get("/metrics").text
    got = counts(text)
    assert {k: v for k, v in got.items() if k[2] == "5xx"} == {
        ("POST", "/streams/{name}", "5xx"): 1, ("POST", "/v1/logs", "5xx"): 1,
        ("GET", "/streams", "5xx"): 1}
    logged = [(r.name, r.exc_info is not None) for r in caplog.records]
    assert logged == [("comet.gateway.ingest", True), ("comet.gateway.otlp", True),
                      ("comet.gateway.app", True)], logged
