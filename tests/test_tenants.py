"""Tenants that stay apart (issue 39, points 2 and 5): one token's slow uploads
leave the in-flight budget to the others; one token cannot take every stream
max_streams allows, nor the room of the streams the operator named (OTLP); an
Idempotency-Key is one token's own, and a retry with the same key and body is
answered once whatever partition key it carries, on any worker; /metrics shows
a token only the streams it may read."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from pathlib import Path

import orjson
import pytest
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.tokens import Token, digest_of

from .support.attacks import send_slowly
from .support.gateway_app import JSON, config, stored
from .support.server import SMALL, GatewayProcess

TENANTS = (Token("alpha", digest_of(b"alpha-secret"), write=("a-*",), read=("a-*",)),
           Token("bravo", digest_of(b"bravo-secret"), write=("b-*", "otel-logs"), read=("b-*",)),
           Token("carol", digest_of(b"carol-secret"), write=("*",), read=("*",)),
           Token("dave", digest_of(b"dave-secret"), write=("*",)),
           Token("erin", digest_of(b"erin-secret"), write=("*",)))


def bearer(name: str) -> dict[str, str]:
    return {**JSON, "authorization": f"Bearer {name}-secret"}


OTLP_LOG = orjson.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": [
    {"body": {"stringValue": "hello"}}]}]}]})


# ---- the in-flight budget ---------------------------------------------------------------

def test_one_tokens_slow_uploads_leave_the_budget_to_the_others(tmp_path: Path) -> None:
    """Four chunked POSTs of one token sending a byte a second held the whole budget
    (each counted as max_body_bytes) and every other token got 429 busy."""
    tokens = (tmp_path / "tokens.toml")
    tokens.write_text('[[tokens]]\nname = "alpha"\ntoken = "alpha-secret"\nwrite = ["a-*"]\n'
                      '[[tokens]]\nname = "bravo"\ntoken = "bravo-secret"\nwrite = ["b-*"]\n')
    tokens.chmod(0o600)
    env = {**SMALL, "COMET_AUTH": "on", "COMET_TOKENS_FILE": str(tokens)}
    with GatewayProcess(tmp_path / "data", 1, env=env) as server:
        server.wait_ready()
        slow: list[socket.socket] = []
        for _ in range(4):
            sock = server.connect()
            sock.sendall(b"POST /streams/a-slow HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer alpha-secret\r\n"
                         b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n[\r\n")
            threading.Thread(target=send_slowly, args=(sock, b"1\r\n \r\n" * 100, 1.0,
                                                       time.monotonic() + 8), daemon=True).start()
            slow.append(sock)
        time.sleep(0.5)  # the four are reading their bodies
        statuses = [server.request("POST", "/streams/b-fast", b'{"n":1}', bearer("bravo"))[0]
                    for _ in range(20)]
        for sock in slow:
            sock.close()
        assert statuses == [202] * 20, statuses
        assert server.stop() == 0


def test_a_tenant_holds_at_most_its_share_of_the_budget(data_dir: Path) -> None:
    """inflight_share of inflight_bytes per token; a token with nothing in flight always
    gets one request in, whatever it declares."""
    from gateway.bodies import Reservation
    from gateway.routes import LAYOUT
    from gateway.runtime import Runtime

    runtime = Runtime(config(data_dir, auth="on", tokens=TENANTS, inflight_bytes=1000,
                             inflight_share=0.25, max_body_bytes=900), LAYOUT)
    alpha = Reservation(runtime, "a-1", TENANTS[0])
    alpha.hold(900)  # alone for its tenant: in, though above its share
    second = Reservation(runtime, "a-1", TENANTS[0])
    with pytest.raises(Exception) as refused:
        second.hold(10)
    assert getattr(refused.value, "status", None) == 429 and "alpha" in str(refused.value)
    bravo = Reservation(runtime, "b-1", TENANTS[1])
    bravo.hold(100)  # the worker's budget has room: another tenant gets in
    alpha.release()
    bravo.release()
    assert runtime.inflight == 0 and runtime.tenants == {}


# ---- streams ----------------------------------------------------------------------------

def test_one_token_cannot_take_every_stream_nor_the_otlp_streams_room(data_dir: Path) -> None:
    cfg = config(data_dir, auth="on", tokens=TENANTS, max_streams=4)  # a token may create 1
    with TestClient(create_app(cfg)) as c:
        assert c.post("/streams/a-0", content=b"{}", headers=bearer("alpha")).status_code == 202
        refused = c.post("/streams/a-1", content=b"{}", headers=bearer("alpha"))
        assert refused.status_code == 409 and refused.json()["error"] == "too_many_streams"
        assert "alpha" in refused.json()["detail"]
        for name in ("carol", "dave", "erin"):  # every other token still creates its own
            assert c.post(f"/streams/{name}-0", content=b"{}", headers=bearer(name)).status_code == 202
        assert c.post("/streams/a-0", content=b"{}", headers=bearer("alpha")).status_code == 202
        full = c.post("/streams/b-0", content=b"{}", headers=bearer("bravo"))
        assert full.status_code == 409 and "max_streams is 4" in full.json()["detail"]
        said = full.json()["detail"].replace("max_streams is 4", "").replace("'b-0'", "")
        assert not any(ch.isdigit() for ch in said), said  # not how many streams exist
        # the OTLP stream the operator configured is created on top of max_streams
        otlp = c.post("/v1/logs", content=OTLP_LOG, headers=bearer("bravo"))
        assert otlp.status_code == 200, otlp.text
    assert len(stored(data_dir, "otel-logs")) == 1


def test_a_deleted_stream_no_longer_counts_for_its_creator(data_dir: Path) -> None:
    admin = Token("ops", digest_of(b"ops-secret"), admin=True)
    cfg = config(data_dir, auth="on", tokens=(*TENANTS, admin), max_streams=4, admin=True)
    with TestClient(create_app(cfg)) as c:
        assert c.post("/streams/a-0", content=b"{}", headers=bearer("alpha")).status_code == 202
        assert c.delete("/streams/a-0", headers=bearer("ops")).status_code == 200
        assert c.post("/streams/a-1", content=b"{}", headers=bearer("alpha")).status_code == 202


# ---- Idempotency-Key --------------------------------------------------------------------

def test_an_idempotency_key_is_one_tokens_own(data_dir: Path) -> None:
    with TestClient(create_app(config(data_dir, auth="on", tokens=TENANTS))) as c:
        first = c.post("/streams/shared", content=b'{"who":"carol"}',
                       headers={**bearer("carol"), "idempotency-key": "k-1"})
        assert first.status_code == 202
        same = c.post("/streams/shared", content=b'{"who":"carol"}',
                      headers={**bearer("dave"), "idempotency-key": "k-1"})
        assert same.status_code == 202 and "idempotent-replayed" not in same.headers
        other = c.post("/streams/shared", content=b'{"who":"erin"}',
                       headers={**bearer("erin"), "idempotency-key": "k-1"})
        assert other.status_code == 202, other.text  # not carol's 422, naming her batch
        again = c.post("/streams/shared", content=b'{"who":"carol"}',
                       headers={**bearer("carol"), "idempotency-key": "k-1"})
        assert again.headers.get("idempotent-replayed") == "true" and again.json() == first.json()
    assert sorted(stored(data_dir, "shared")) == [b'{"who":"carol"}', b'{"who":"carol"}',
                                                  b'{"who":"erin"}']


def test_a_retry_with_another_partition_key_is_answered_once_on_any_worker(tmp_path: Path) -> None:
    with GatewayProcess(tmp_path / "data", 2, env=SMALL) as server:
        server.wait_ready()
        answers = []
        for partition in ("device-1", "device-2", "device-3", "device-1", "device-9"):
            status, body, headers = server.request(
                "POST", "/streams/keyed", b'{"batch": 1}',
                {**JSON, "idempotency-key": "batch-0001", "x-comet-key": partition})
            assert status == 202, body
            answers.append((orjson.loads(body), headers.get("idempotent-replayed")))
        assert server.stop() == 0
    assert all(body == answers[0][0] for body, _ in answers), answers
    assert [replayed for _, replayed in answers] == [None] + ["true"] * 4
    assert stored(tmp_path / "data", "keyed") == [b'{"batch":1}']


# ---- /metrics ---------------------------------------------------------------------------

def test_metrics_show_a_token_only_the_streams_it_may_read(data_dir: Path) -> None:
    with TestClient(create_app(config(data_dir, auth="on", tokens=TENANTS))) as c:
        for stream, who in (("a-1", "alpha"), ("b-secret", "bravo")):
            assert c.post(f"/streams/{stream}", content=b"{}", headers=bearer(who)).status_code == 202
        alpha = c.get("/metrics", headers=bearer("alpha")).text
        carol = c.get("/metrics", headers=bearer("carol")).text
        assert c.get("/metrics", headers=bearer("dave")).status_code == 403  # reads nothing
    assert 'stream="a-1"' in alpha and "b-secret" not in alpha
    assert 'stream="a-1"' in carol and 'stream="b-secret"' in carol


def test_the_first_requests_of_a_new_stream_open_it_once(data_dir: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests that find a stream closed together (the first ones of a new stream, one per
    connection) wait for one open on a thread, not a thread each; when that open fails for
    its token (alpha's share of the streams is spent), a waiting request of another token
    (carol) tries for itself and creates the stream."""
    from gateway.writes import Writer
    cfg = config(data_dir, auth="on", tokens=TENANTS, max_streams=4)  # a token may create 1
    app = create_app(cfg)
    opens: list[str | None] = []
    real_open = Writer.open_stream

    def slow_open(self: Writer, stream: str, token: Token | None = None) -> None:
        opens.append(token.name if token else None)
        time.sleep(0.2)  # long enough for every request below to find the stream closed
        real_open(self, stream, token)

    monkeypatch.setattr(Writer, "open_stream", slow_open)
    with TestClient(app) as c:
        assert c.post("/streams/a-0", content=b"{}", headers=bearer("alpha")).status_code == 202
        opens.clear()
        alpha, carol = TENANTS[0], TENANTS[2]

        async def together(tokens: list[Token]) -> list[BaseException | None]:
            return await asyncio.gather(*(app.writer.open_once("a-new", t) for t in tokens),
                                        return_exceptions=True)

        portal = c.portal
        assert portal is not None
        results = portal.call(together, [alpha] + [carol] * 15)
        assert opens == ["alpha", "carol"]  # alpha's, refused; one of carol's, which created it
        assert isinstance(results[0], Exception) and "too_many_streams" in str(results[0].__dict__)
        assert results[1:] == [None] * 15
        assert c.post("/streams/a-new", content=b"{}", headers=bearer("carol")).status_code == 202
        opens.clear()
        assert portal.call(together, [carol] * 16) == [None] * 16
        assert opens == []  # open already: no thread at all
