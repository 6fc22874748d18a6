"""Every phase of a connection has a limit (issue 39, points 1 and 2): a head too
large or with too many fields is 431 at once, a head or a body that comes too
slowly is 408, a connection that says nothing is closed, a worker keeps at
most max_connections and a new client takes the place of an idle one.  Each
attack runs against a real `comet serve`, on the plain and the TLS listener,
and each refusal is counted in /metrics and logged once, not per connection."""

from __future__ import annotations

import resource
import socket
import threading
import time
from pathlib import Path
from typing import Iterator

import orjson
import pytest

from .support.attacks import closed_within, post_json, response_of, trickle_then_answer, workers_rss_kib
from .support.faulty_load import log_records
from .support.server import COMET, SMALL, GatewayProcess, ServerProcess, free_port
from .support.tls import Pki

# Short deadlines, so that the attacks take seconds (the defaults are 10, 5 and 10 s).
QUICK = {**SMALL, "COMET_HEADER_TIMEOUT_S": "2", "COMET_IDLE_TIMEOUT_S": "1",
         "COMET_BODY_TIMEOUT_S": "2", "COMET_BODY_MIN_RATE": "1024"}
HEAD = b"POST /streams/door HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki.make(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module", params=["http", "tls"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           pki: Pki) -> Iterator[GatewayProcess]:
    data_dir = tmp_path_factory.mktemp("door") / "data"
    if request.param == "tls":
        s = GatewayProcess(data_dir, 2, env={**QUICK, **pki.env()}, tls=pki.client_context())
    else:
        s = GatewayProcess(data_dir, 2, env=QUICK)
    with s:
        s.wait_ready()
        yield s
        assert s.stop() == 0


def sent_in_background(sock: socket.socket, data: bytes) -> threading.Thread:
    """Sends ``data`` on a thread (the server may stop reading it half-way)."""
    def send() -> None:
        try:
            sock.sendall(data)
        except OSError:
            pass
    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def test_a_huge_header_is_431_at_once_and_costs_the_worker_nothing(server: GatewayProcess) -> None:
    before = workers_rss_kib(server)
    sock = server.connect()
    sender = sent_in_background(sock, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: "
                                + b"a" * (32 << 20) + b"\r\n\r\n")
    t0 = time.monotonic()
    status, body = response_of(sock)
    took = time.monotonic() - t0
    sender.join(30)
    sock.close()
    assert status == 431 and orjson.loads(body)["error"] == "header_too_large", (status, body)
    assert took < 5, f"the 431 took {took:.1f} s"
    grown = max(workers_rss_kib(server)[pid] - kib for pid, kib in before.items())
    assert grown < 16 << 10, f"a worker grew by {grown} KiB reading a 32 MiB header"
    assert server.request("GET", "/healthz")[0] == 200


def test_too_many_header_fields_are_431_and_the_limit_itself_passes(server: GatewayProcess) -> None:
    fields = lambda n: b"".join(b"X-F%d: v\r\n" % i for i in range(n))  # noqa: E731
    sock = server.connect()
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + fields(100) + b"\r\n")
    status, body = response_of(sock)
    assert status == 431 and orjson.loads(body)["error"] == "too_many_headers"
    sock.close()
    # 100 fields in all (Host and 99 more) and a head just under 64 KiB are served
    status, _, _ = server.request("GET", "/healthz", headers={f"x-f{i}": "v" for i in range(97)})
    assert status == 200
    status, _, _ = server.request("GET", "/healthz", headers={"x-pad": "a" * ((64 << 10) - 4096)})
    assert status == 200


def test_pipelined_requests_after_a_body_are_not_taken_for_one_long_head(server: GatewayProcess) -> None:
    body = b'{"pad":"' + b"p" * (200 << 10) + b'"}'
    one = HEAD + b"Content-Length: %d\r\n\r\n" % len(body) + body
    sock = server.connect()
    sock.sendall(one + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * 600
                 + b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    data = b""
    sock.settimeout(30)
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    assert data.count(b"HTTP/1.1 202 ") == 1 and data.count(b"HTTP/1.1 200 ") == 601


def test_a_head_that_comes_too_slowly_is_408(server: GatewayProcess) -> None:
    sock = server.connect()
    t0 = time.monotonic()
    status, body = trickle_then_answer(sock, b"GET /healthz HTTP/1.1\r\nX-A: b\r\n", 0.3, t0 + 20,
                                       timeout=20)
    took = time.monotonic() - t0
    sock.close()
    assert status == 408 and orjson.loads(body)["error"] == "header_timeout", (status, body)
    assert 1.5 < took < 6, f"closed after {took:.1f} s (header_timeout_s is 2)"


def test_a_connection_that_says_nothing_is_closed(server: GatewayProcess) -> None:
    """Before its first request (plain), or before its TLS handshake."""
    raw = socket.create_connection(("127.0.0.1", server.port))
    took = closed_within(raw, 20)
    raw.close()
    assert took < 5, f"a silent connection stayed {took:.1f} s"


def test_a_body_that_comes_too_slowly_is_408_and_stores_nothing(server: GatewayProcess) -> None:
    sock = server.connect()
    sock.sendall(HEAD + b"Transfer-Encoding: chunked\r\n\r\n")
    t0 = time.monotonic()
    chunks = b"".join(b"1\r\n%s\r\n" % bytes([c]) for c in b'{"slow": "loris"}')
    status, body = trickle_then_answer(sock, chunks, 0.3, t0 + 30, timeout=30)
    took = time.monotonic() - t0
    sock.close()
    assert status == 408 and orjson.loads(body)["error"] == "body_timeout", (status, body)
    assert took < 8, f"answered after {took:.1f} s"
    entries = server.request("GET", "/streams/door/entries")
    assert entries[0] == 404 or b"loris" not in entries[1]


def test_a_body_that_keeps_the_minimum_rate_is_stored_however_long_it_takes(server: GatewayProcess) -> None:
    event = b'{"steady": "' + b"s" * 8000 + b'"}'
    sock = server.connect()
    sock.sendall(HEAD + b"Content-Length: %d\r\n\r\n" % len(event))
    for i in range(0, len(event), 700):  # ~2.3 KiB/s for 3.5 s: past body_timeout_s, above the rate
        sock.sendall(event[i:i + 700])
        time.sleep(0.3)
    status, _ = response_of(sock, timeout=10)  # keep-alive: the test reads to the timeout
    sock.close()
    assert status == 202


def test_refusals_are_counted_and_logged_once_a_minute(server: GatewayProcess) -> None:
    for _ in range(5):
        sock = server.connect()
        sock.sendall(b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * (70 << 10) + b"\r\n\r\n")
        assert response_of(sock)[0] == 431
        sock.close()
    text = server.request("GET", "/metrics")[1].decode()
    counted = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                  if line.startswith('comet_http_refused_total{') and 'reason="header_too_large"' in line)
    assert counted >= 5
    lines = [r for r in log_records(server, "connection_refused") if r["reason"] == "header_too_large"]
    assert 1 <= len(lines) <= server.workers, lines  # one per worker per minute, not one per connection


def test_no_answer_names_the_server(server: GatewayProcess) -> None:
    _, _, headers = server.request("GET", "/healthz")
    assert "server" not in {k.lower() for k in headers}


@pytest.mark.slow
def test_silent_connections_at_the_file_limit_do_not_shut_out_other_clients(tmp_path: Path) -> None:
    """1,000 connections that say nothing against two workers whose file limit is 400:
    each worker keeps what its limit allows (max_connections, derived), and a new
    client takes the place of the longest silent one instead of being reset."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"this process may open {hard} files; the test holds 1,000 connections")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    port = free_port()
    argv = ["prlimit", "--nofile=400:400", str(COMET), "serve", "--data-dir", str(tmp_path / "data"),
            "--host", "127.0.0.1", "--port", str(port), "--workers", "2"]
    with ServerProcess(argv, port, workers=2, log_path=tmp_path / "serve.log", env=SMALL) as server:
        server.wait_ready()
        silent = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(1000)]
        try:
            statuses = [post_json(server, "crowded") for _ in range(40)]
        finally:
            for sock in silent:
                sock.close()
        assert statuses == [202] * 40, statuses
        lines = log_records(server, "connection_refused")
        assert any(r["reason"] == "connection_limit" for r in lines), lines
        assert server.stop() == 0
