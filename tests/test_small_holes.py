"""The smaller holes of issue 39, point 7: access lines that stay whole however
long the path, one reading of Authorization on every route, an encoded "/"
that is never a route, group names checked before anything, a refused client
certificate in the log, and TLS 1.2 without CBC suites."""

from __future__ import annotations

import json
import socket
import ssl
import threading
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from gateway.app import create_app

from .support.attacks import response_of
from .support.faulty_load import log_records
from .support.gateway_app import JSON, config
from .support.server import SMALL, GatewayProcess
from .support.tls import Pki

PIPE_BUF = 4096


def test_access_lines_stay_within_one_pipe_write_however_long_the_path(tmp_path: Path) -> None:
    env = {**SMALL, "COMET_AUTH": "on", "COMET_TOKENS": "s3cret-token"}
    with GatewayProcess(tmp_path / "data", 2, env=env) as server:
        server.wait_ready()

        def flood(n: int) -> None:
            for i in range(50):
                server.request("POST", f"/streams/{n}-{i}" + "p" * 20_000, b"{}", JSON)

        threads = [threading.Thread(target=flood, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert server.stop() == 0
    access = [line for line in server.log_path.read_bytes().splitlines() if b'"event":"request"' in line]
    assert len(access) == 200
    assert max(len(line) for line in access) < PIPE_BUF
    assert all(json.loads(line)["status"] == 401 for line in access)


def test_two_authorization_headers_are_refused_on_every_route(tmp_path: Path) -> None:
    """POST took the last header and the other routes the first: whichever one a
    proxy checked, the gateway could act on the other."""
    env = {**SMALL, "COMET_AUTH": "on", "COMET_TOKENS": "s3cret-token"}
    with GatewayProcess(tmp_path / "data", 1, env=env) as server:
        server.wait_ready()
        for method, path in (("POST", "/streams/ev"), ("GET", "/streams/ev"), ("GET", "/streams"),
                             ("GET", "/metrics"), ("POST", "/v1/logs")):
            for pair in (("s3cret-token", "nope"), ("nope", "s3cret-token")):
                sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
                sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                             f"Authorization: Bearer {pair[0]}\r\nAuthorization: Bearer {pair[1]}\r\n"
                             "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}".encode())
                status, answer = response_of(sock)
                sock.close()
                assert status == 401 and b"one 'Authorization" in answer, (method, path, answer)
        assert server.stop() == 0


@pytest.mark.parametrize("method, path, code", [
    ("GET", "/streams/ev%2Fentries", "invalid_stream_name"),
    ("GET", "/streams/ev%2fgroups", "invalid_stream_name"),
    ("POST", "/streams/ev%2Fentries", "invalid_stream_name"),
    ("GET", "/streams/ev/groups/g%2Fh", "invalid_group_name"),
    ("DELETE", "/streams/ev/groups/g%2F..", "invalid_group_name"),
])
def test_an_encoded_slash_is_never_a_route(data_dir: Path, method: str, path: str, code: str) -> None:
    with TestClient(create_app(config(data_dir, admin=True))) as c:
        assert c.post("/streams/ev", content=b"{}", headers=JSON).status_code == 202
        r = c.request(method, path, content=b"{}" if method == "POST" else None, headers=JSON)
        assert r.status_code == 400 and r.json()["error"] == code, r.text


@pytest.mark.parametrize("group", ["..", ".", "a%00b", "g" * 60, "sp%20ace"])
@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
def test_a_bad_group_name_is_400_on_every_group_route(tmp_path: Path, group: str, method: str) -> None:
    """Sent as raw bytes: an HTTP client would take "/.." for a step up the path."""
    with GatewayProcess(tmp_path / "data", 1, env={**SMALL, "COMET_ADMIN": "1"}) as server:
        server.wait_ready()
        assert server.request("POST", "/streams/ev", b"{}", JSON)[0] == 202
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        body = b'{"to": "earliest"}'
        sock.sendall(f"{method} /streams/ev/groups/{group} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        status, answer = response_of(sock)
        sock.close()
        assert status == 400 and json.loads(answer)["error"] == "invalid_group_name", answer
        assert server.request("GET", "/streams/ev")[0] == 200  # and nothing happened to the stream
        assert server.stop() == 0


def test_a_group_reset_reads_no_more_than_a_reset_needs(data_dir: Path) -> None:
    """Every body is bounded: the ingest paths' by max_body_bytes, a group reset's by 4 KiB."""
    with TestClient(create_app(config(data_dir, admin=True))) as c:
        assert c.post("/streams/ev", content=b"{}", headers=JSON).status_code == 202
        r = c.put("/streams/ev/groups/g", content=b'{"to": "earliest", "pad": "' + b"p" * (8 << 20) + b'"}')
        assert r.status_code == 413 and r.json()["error"] == "body_too_large", r.text


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki.make(tmp_path_factory.mktemp("pki"))


def test_a_refused_client_certificate_is_logged(tmp_path: Path, pki: Pki) -> None:
    env = {**SMALL, **pki.env(mutual=True)}
    with GatewayProcess(tmp_path / "data", 1, env=env, tls=pki.client_context(pki.client)) as server:
        server.wait_ready()
        for cert in (pki.stranger, None):
            ctx = pki.client_context(cert)
            try:
                with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
                    with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                        tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                        answer = tls.recv(100)  # TLS 1.3: the refusal comes after the handshake
            except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
                answer = b""
            assert answer == b""
        assert server.stop() == 0
        lines = [r for r in log_records(server, "connection_refused") if r["reason"] == "tls_handshake"]
    assert {r["error"] for r in lines} >= {"CERTIFICATE_VERIFY_FAILED"}, lines
    assert any("certificate" in r["error"].lower() for r in lines if r["error"] != "CERTIFICATE_VERIFY_FAILED")


def test_tls_1_2_offers_only_aead_suites(tmp_path: Path, pki: Pki) -> None:
    with GatewayProcess(tmp_path / "data", 1, env={**SMALL, **pki.env()}, tls=pki.client_context()) as server:
        server.wait_ready()

        def handshake(ciphers: str) -> str:
            ctx = pki.client_context()
            ctx.maximum_version = ssl.TLSVersion.TLSv1_2
            ctx.set_ciphers(ciphers)
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
                with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                    cipher = tls.cipher()
                    assert cipher is not None
                    return cipher[0]

        for cbc in ("ECDHE-ECDSA-AES128-SHA", "ECDHE-ECDSA-AES256-SHA384", "ECDHE-ECDSA-AES128-SHA256"):
            with pytest.raises(ssl.SSLError):
                handshake(cbc)
        assert "GCM" in handshake("ECDHE-ECDSA-AES128-GCM-SHA256")
        assert "CHACHA20" in handshake("ECDHE-ECDSA-CHACHA20-POLY1305")
        assert server.stop() == 0
