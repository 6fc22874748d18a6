"""What a careless operator could set up without a word (issue 39, point 6, and the
secret files of point 3): configured tokens that nothing asks for, a token too
short to resist guessing, guesses nobody hears of, and a TLS key or tokens
file every local user can read."""

from __future__ import annotations

import http.client
import subprocess
from pathlib import Path

import pytest

from gateway.config import ConfigError, load

from .support.faulty_load import log_records
from .support.server import COMET, SMALL, GatewayProcess
from .support.tls import Pki


def test_configured_tokens_that_are_not_enforced_are_warned_of(tmp_path: Path) -> None:
    """auth = "auto" on loopback needs no token: with tokens configured, say so at start."""
    env = {**SMALL, "COMET_TOKENS": "s3cret-token"}
    with GatewayProcess(tmp_path / "data", 1, env=env) as server:
        server.wait_ready()
        assert server.request("POST", "/streams/open", b"{}", {"content-type": "application/json"})[0] == 202
        assert server.stop() == 0
        warned = log_records(server, "tokens_not_enforced")
    assert len(warned) == 1 and warned[0]["level"] == "warning" and 'auth = "on"' in warned[0]["action"]
    with GatewayProcess(tmp_path / "data", 1, env={**env, "COMET_AUTH": "on"}) as server:
        server.wait_ready()
        assert server.stop() == 0
        assert log_records(server, "tokens_not_enforced") == []


def test_a_token_shorter_than_min_token_length_stops_the_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="token 'token-1' is 1 characters long.*min_token_length"):
        load(None, env={"COMET_AUTH": "on", "COMET_TOKENS": "x"})
    toml = tmp_path / "comet.toml"
    toml.write_text('auth = "on"\n[[tokens]]\nname = "edge"\ntoken = "short"\nwrite = ["*"]\n')
    out = subprocess.run([str(COMET), "serve", "--config", str(toml), "--data-dir", str(tmp_path / "d")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "token 'edge' is 5 characters long" in out.stderr
    assert not (tmp_path / "d").exists()
    assert load(None, env={"COMET_AUTH": "on", "COMET_TOKENS": "x", "COMET_MIN_TOKEN_LENGTH": "1"})


def test_failed_authentications_are_counted_logged_and_close_the_connection(tmp_path: Path) -> None:
    env = {**SMALL, "COMET_AUTH": "on", "COMET_TOKENS": "s3cret-token"}
    with GatewayProcess(tmp_path / "data", 2, env=env) as server:
        server.wait_ready()
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        for i in range(50):
            conn.request("GET", "/streams", headers={"authorization": f"Bearer guess-{i:04d}"})
            r = conn.getresponse()
            r.read()
            assert r.status == 403 and r.getheader("connection") == "close"
            conn.close()  # the server closed it: a guess costs a connection
        for path in ("/streams/x", "/metrics"):
            assert server.request("GET", path)[0] == 401
        metrics = server.request("GET", "/metrics", headers={"authorization": "Bearer s3cret-token"})[1]
        counted = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.decode().splitlines()
                      if line.startswith("comet_http_auth_failures_total{"))
        assert counted == 52
        assert server.stop() == 0
        lines = [r for r in log_records(server, "connection_refused") if r["reason"] == "auth_failed"]
    # one line per worker, client and status a minute: 403s and 401s of one client
    assert 2 <= len(lines) <= 2 * server.workers, lines
    assert {r["status"] for r in lines} == {401, 403} and all(r["client"] == "127.0.0.1" for r in lines)
    assert sum(r["repeats"] for r in lines) == 0  # the repeats are told in the next minute's line


def test_a_tls_key_or_tokens_file_others_can_read_is_warned_of(tmp_path: Path) -> None:
    pki = Pki.make(tmp_path / "pki")
    pki.server.key.chmod(0o644)
    tokens = tmp_path / "tokens.toml"
    tokens.write_text('[[tokens]]\nname = "edge"\ntoken = "edge-secret"\nwrite = ["*"]\n')
    tokens.chmod(0o644)
    env = {**SMALL, **pki.env(), "COMET_AUTH": "on", "COMET_TOKENS_FILE": str(tokens)}
    with GatewayProcess(tmp_path / "data", 1, env=env, tls=pki.client_context()) as server:
        server.wait_ready()
        assert server.stop() == 0
        warned = {r["setting"]: r for r in log_records(server, "secret_readable_by_others")}
    assert set(warned) == {"tls_key_file", "tokens_file"}
    assert warned["tls_key_file"]["mode"] == "0644" and "chmod 600" in warned["tls_key_file"]["action"]
