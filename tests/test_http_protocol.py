"""The gateway's HTTP/1.1 connection handling, byte by byte, against a real
`comet serve` (gateway.serving.protocol.CometHttpProtocol): a body longer than its
Content-Length, pipelining, half-closed clients, and connections that meet a
graceful stop.  The rule throughout: a client never gets an error (or a
reset) for an event that was stored, and every request sent gets a status.
Each test runs against a plain and a TLS listener (tests/support/tls.py),
except the half-close, which TLS has no way to say."""

from __future__ import annotations

import gzip
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Iterator, Mapping

import orjson
import pytest

from storage_c import Config, Log

from .support.server import SMALL, GatewayProcess
from .support.tls import Pki

INVALID = b"Invalid HTTP request received."


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki.make(tmp_path_factory.mktemp("pki"))


def launch(data_dir: Path, listener: str, pki: Pki, workers: int = 2) -> GatewayProcess:
    """A gateway speaking ``listener`` ("http" or "tls")."""
    if listener == "tls":
        return GatewayProcess(data_dir, workers, env={**SMALL, **pki.env()}, tls=pki.client_context())
    return GatewayProcess(data_dir, workers, env=SMALL)


@pytest.fixture(scope="module", params=["http", "tls"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           pki: Pki) -> Iterator[GatewayProcess]:
    with launch(tmp_path_factory.mktemp("proto") / "data", request.param, pki) as s:
        s.wait_ready()
        yield s
        assert s.stop() == 0


def post(event: dict[str, object], *, close: bool = False, length: int | None = None,
         extra: bytes = b"", gzipped: bool = False) -> bytes:
    body = gzip.compress(orjson.dumps(event)) if gzipped else orjson.dumps(event)
    head = (f"POST /streams/proto HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body) if length is None else length}\r\n")
    if close:
        head += "Connection: close\r\n"
    if gzipped:  # decoded and stored on a worker thread: the answer takes a few loop turns
        head += "Content-Encoding: gzip\r\n"
    return head.encode() + b"\r\n" + body + extra


def connect(server: GatewayProcess, handshake: bool = True) -> socket.socket:
    return server.connect(timeout=15, handshake=handshake)


def read_until_eof(sock: socket.socket) -> bytes:
    """Everything the server sends; a reset fails the test."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def parse(data: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """The responses in ``data`` (every gateway response has a Content-Length)."""
    out = []
    while data:
        head, sep, data = data.partition(b"\r\n\r\n")
        assert sep, f"truncated response head: {head!r}"
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        n = int(headers["content-length"])
        assert len(data) >= n, "truncated response body"
        out.append((status, headers, data[:n]))
        data = data[n:]
    return out


def read_responses(sock: socket.socket, count: int) -> list[tuple[int, dict[str, str], bytes]]:
    """Exactly ``count`` responses, leaving the connection open."""
    data = b""
    while True:
        try:
            got = parse(data)
            if len(got) == count:
                return got
        except (AssertionError, ValueError, KeyError):
            pass
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {data!r}"
        data += chunk


def stored(data_dir: Path, stream: str = "proto") -> list[dict[str, object]]:
    with Log(data_dir, Config(background_flush=False)) as log:
        if stream not in log.streams():
            return []
        return [orjson.loads(p) for s in range(log.shard_count(stream))
                for b in log.iter_entries(stream, s) for p in b.payloads]


def count_stored(data_dir: Path, event: Mapping[str, object]) -> int:
    return sum(1 for e in stored(data_dir) if e == event)


def check_202(response: tuple[int, dict[str, str], bytes], data_dir: Path, event: dict[str, object]) -> None:
    status, _, body = response
    assert status == 202, response
    res = orjson.loads(body)
    with Log(data_dir, Config(background_flush=False)) as log:
        batch = [orjson.loads(p) for b in log.iter_entries("proto", res["shard"]) for p in b.payloads]
    assert batch[res["first"]: res["last"] + 1] == [event]
    assert count_stored(data_dir, event) == 1


# ---- a body longer than its Content-Length ----------------------------------------------

@pytest.mark.parametrize("garbage_later", [False, True], ids=["same-packet", "next-packet"])
def test_short_content_length_gets_its_202_then_a_400(server: GatewayProcess, garbage_later: bool) -> None:
    event = {"case": "short-length", "later": garbage_later}
    body = orjson.dumps(event)
    garbage = b'}, "more": "bytes than declared"}'  # not a request line: the parser fails on it
    with connect(server) as sock:
        if garbage_later:
            sock.sendall(post(event, length=len(body)))
            first = read_responses(sock, 1)
            sock.sendall(garbage)
            rest = parse(read_until_eof(sock))
            responses = first + rest
        else:
            sock.sendall(post(event, length=len(body), extra=garbage))
            responses = parse(read_until_eof(sock))
    assert [r[0] for r in responses] == [202, 400], responses
    check_202(responses[0], server.data_dir, event)
    assert responses[1][2] == INVALID and responses[1][1]["connection"] == "close"


def test_pipelined_requests_are_each_answered_in_order(server: GatewayProcess) -> None:
    events = [{"case": "pipelined", "n": n} for n in range(4)]
    wire = b"".join(post(e) for e in events[:-1]) + post(events[-1], close=True)
    with connect(server) as sock:
        sock.sendall(wire)
        responses = parse(read_until_eof(sock))
    assert [r[0] for r in responses] == [202] * 4, responses
    for response, event in zip(responses, events):
        check_202(response, server.data_dir, event)
    assert responses[-1][1]["connection"] == "close"


def test_pipelined_requests_then_garbage(server: GatewayProcess) -> None:
    events = [{"case": "pipelined-garbage", "n": n} for n in range(3)]
    with connect(server) as sock:
        sock.sendall(b"".join(post(e) for e in events) + b"NOT HTTP AT ALL\r\n\r\n")
        responses = parse(read_until_eof(sock))
    assert [r[0] for r in responses] == [202, 202, 202, 400], responses
    for response, event in zip(responses, events):
        check_202(response, server.data_dir, event)


def test_bad_chunked_body_stores_nothing(server: GatewayProcess) -> None:
    """The bad bytes inside a request's own body: that request is never
    complete, it gets the 400 and nothing is stored."""
    event = {"case": "bad-chunk"}
    body = orjson.dumps(event)
    wire = (b"POST /streams/proto HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % len(body) + body + b"\r\nzz\r\n")
    with connect(server) as sock:
        sock.sendall(wire)
        responses = parse(read_until_eof(sock))
    assert [r[0] for r in responses] == [400], responses
    assert count_stored(server.data_dir, event) == 0


@pytest.mark.parametrize("server", ["http"], indirect=True)  # TLS's close_notify closes both ways
@pytest.mark.parametrize("gzipped", [False, True], ids=["identity", "gzip"])
def test_half_closed_client_gets_its_answer(server: GatewayProcess, gzipped: bool) -> None:
    event = {"case": "half-close", "gzip": gzipped}
    with connect(server) as sock:
        sock.sendall(post(event, gzipped=gzipped))
        sock.shutdown(socket.SHUT_WR)  # "that is all I send"; the answer must still come
        responses = parse(read_until_eof(sock))
    assert [r[0] for r in responses] == [202], responses
    check_202(responses[0], server.data_dir, event)


# ---- a graceful stop ---------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("listener", ["http", "tls"])
def test_connections_meeting_a_graceful_stop_get_a_status(data_dir: Path, pki: Pki, listener: str) -> None:
    """One worker gets TERM (as on a HUP reload).  Connections that have sent
    nothing yet when it starts draining - opened before the stop, idle
    keep-alive, opened just after the TERM, opened once the drain began - send
    their request a few ms later: each gets a status, none a reset."""
    with launch(data_dir, listener, pki, workers=1) as server:
        server.wait_ready()
        a = connect(server)                     # opened before the stop, nothing sent
        b = connect(server)                     # keep-alive, idle at the stop
        b.sendall(post({"case": "drain", "conn": "b", "n": 0}))
        assert read_responses(b, 1)[0][0] == 202  # also proves a was accepted (queued before b)
        [worker] = server.worker_pids()
        shutting = server.log_path.read_bytes().count(b"Shutting down")
        os.kill(worker, signal.SIGTERM)
        # c and d: over TLS, the handshake goes with the request (a client blocked in a
        # handshake until the draining worker is replaced would never send it)
        c = connect(server, handshake=False)    # opened during the stop, before the drain
        deadline = time.monotonic() + 10
        while server.log_path.read_bytes().count(b"Shutting down") == shutting:
            assert time.monotonic() < deadline, "the worker did not start draining"
            time.sleep(0.005)
        d = connect(server, handshake=False)    # opened once the drain began
        time.sleep(0.02)                        # "a few ms later"
        events = {name: {"case": "drain", "conn": name, "n": 1} for name in "abcd"}
        # Sent from threads, as four clients would: over TLS d's send waits for its
        # handshake with the next worker, which starts once a, b and c are closed.
        senders = [threading.Thread(target=sock.sendall, args=(post(events[name]),), daemon=True)
                   for name, sock in (("a", a), ("b", b), ("c", c), ("d", d))]
        for t in senders:
            t.start()
        answers = {}
        for (name, sock), sender in zip((("a", a), ("b", b), ("c", c), ("d", d)), senders):
            sender.join(timeout=30)  # one thread at a time on a TLS socket
            with sock:
                answers[name] = parse(read_until_eof(sock))
        for name, responses in answers.items():
            assert len(responses) == 1, (name, responses)
            status, headers, _ = responses[0]
            assert status in (202, 503), (name, responses)
            if status == 503:
                assert "retry-after" in headers
                assert count_stored(data_dir, events[name]) == 0
            else:
                check_202(responses[0], data_dir, events[name])
        # the draining worker answered a and b itself, and told them it closes
        for name in "ab":
            assert answers[name][0][1].get("connection") == "close", answers[name]
        server.wait_ready()  # the replacement worker holds the slot
        assert server.stop() == 0
