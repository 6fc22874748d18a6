"""Memory a client can make a worker keep (issue 39, point 4): the per-worker
caches hold what the gateway looked up, never what a client made up, so that
requests with long invalid names, or long paths without a token, cost a worker
nothing after their answer."""

from __future__ import annotations

import http.client
from pathlib import Path

from gateway.logs import AccessLog
from gateway.tokens import READ, WRITE, Token, Tokens, digest_of

from .support.attacks import workers_rss_kib
from .support.server import SMALL, GatewayProcess

LONG = 60_000


def test_the_permission_cache_keeps_no_name_a_stream_cannot_have() -> None:
    token = Token("edge", digest_of(b"edge-secret"), write=("logs-*",))
    tokens = Tokens([token])
    for i in range(2000):
        assert not tokens.allows(token, WRITE, f"{i:05d}" + "x" * LONG)
    assert len(tokens._allowed) == 0
    for i in range(3 * Tokens.CACHED):  # valid names: remembered, up to CACHED of them
        tokens.allows(token, READ, f"logs-{i}")
    assert len(tokens._allowed) == Tokens.CACHED


def test_the_access_log_keeps_short_paths_and_writes_short_lines(tmp_path: Path) -> None:
    out = tmp_path / "access.log"
    with open(out, "wb") as f:
        access = AccessLog(fd=f.fileno())
        for i in range(2000):
            access.request(f"/streams/{i:05d}" + "x" * LONG, 401, 0, 0.001, 0, None, ("192.0.2.1", 1))
        access.flush()
    lines = out.read_bytes().splitlines()
    assert len(lines) == 2000 and max(len(line) for line in lines) < 1024
    assert sum(len(quoted) for quoted in access.paths.values()) < 1000 * 300


def rss_after(server: GatewayProcess, paths: list[str], headers: dict[str, str]) -> int:
    """The most any worker's memory grew (KiB) while it answered ``paths``."""
    before = workers_rss_kib(server)
    for _ in range(2):  # new connections land on either worker
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        for path in paths:
            conn.request("POST", path, body=b"{}", headers=headers)
            r = conn.getresponse()
            r.read()
            assert r.status in (400, 401), (r.status, path[:40])
            if r.getheader("connection") == "close":
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        conn.close()
    after = workers_rss_kib(server)
    return max(after[pid] - kib for pid, kib in before.items())


def test_requests_with_long_invalid_names_cost_a_worker_nothing(tmp_path: Path) -> None:
    """5,000 requests whose stream names are 60 KB each: the permission cache, the
    access log's paths and the error log keep none of them."""
    tokens = tmp_path / "tokens.toml"
    tokens.write_text('[[tokens]]\nname = "edge"\ntoken = "edge-secret"\nwrite = ["*"]\n')
    tokens.chmod(0o600)
    env = {**SMALL, "COMET_AUTH": "on", "COMET_TOKENS_FILE": str(tokens)}
    with GatewayProcess(tmp_path / "data", 2, env=env) as server:
        server.wait_ready()
        names = [f"/streams/{i:05d}" + "%20" * (LONG // 3) for i in range(2500)]
        grown = rss_after(server, names, {"content-type": "application/json",
                                          "authorization": "Bearer edge-secret"})
        assert grown < 40 << 10, f"a worker kept {grown} KiB of 5,000 invalid names"
        unauthorized = rss_after(server, [f"/streams/{i:05d}" + "y" * LONG for i in range(1000)],
                                 {"content-type": "application/json"})
        assert unauthorized < 40 << 10, f"a worker kept {unauthorized} KiB of 2,000 refused paths"
        assert server.stop() == 0
