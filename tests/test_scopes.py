"""Scoped tokens: every route and method of the gateway (taken from the app's
own route table) against every kind of token, in process; what GET /streams
lists; the docs' table of scopes against the code's; and one real `comet
serve` with a tokens_file holding a SHA-256 token: the access log names the
tokens, and a HUP that revokes a token makes it 403."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Iterator

import pytest
from starlette.routing import Route
from starlette.testclient import TestClient

from gateway import routes as route_table
from gateway.app import create_app
from gateway.config import load
from gateway.tokens import Token, digest_of
from storage_c import Log

from .support.docs import code_blocks
from .support.gateway_app import JSON, STORAGE, config, stored
from .support.server import SMALL, GatewayProcess

REPO = Path(__file__).resolve().parent.parent
STREAM = "ev"  # every route about a stream is asked about this one (the OTLP paths too)

SECRETS = {"writer": "w-secret", "other": "o-secret", "reader": "r-secret", "admin": "a-secret",
           "full": "f-secret"}
TOKENS = (
    Token("writer", digest_of(b"w-secret"), write=("ev",)),
    Token("other", digest_of(b"o-secret"), write=("logs-*",), read=("logs-*",)),
    Token("reader", digest_of(b"r-secret"), read=("e?",)),
    Token("admin", digest_of(b"a-secret"), admin=True),
    "f-secret",  # a plain token: every scope, named token-1
)
NAMES = {"writer": "writer", "other": "other", "reader": "reader", "admin": "admin",
         "full": "token-1"}
CREDENTIALS: dict[str, str | None] = {"none": None, "unknown": "Bearer nope",
                                      **{who: f"Bearer {s}" for who, s in SECRETS.items()}}
FULL = {"authorization": "Bearer f-secret"}

# What each route needs, written out here (not read from gateway.routes.SCOPES), so the
# test holds the code to it; a route of the app missing here fails the test.
NEEDS = {
    ("/streams/{name}", "POST"): "write",
    ("/streams/{name}", "GET"): "read",
    ("/streams/{name}", "DELETE"): "admin",
    ("/streams/{name}/entries", "GET"): "read",
    ("/streams/{name}/groups", "GET"): "read",
    ("/streams/{name}/groups/{group}", "GET"): "read",
    ("/streams/{name}/groups/{group}", "PUT"): "admin",
    ("/streams/{name}/groups/{group}", "DELETE"): "admin",
    ("/streams", "GET"): "read any",
    ("/v1/logs", "POST"): "write",
    ("/v1/traces", "POST"): "write",
    ("/v1/metrics", "POST"): "write",
    ("/healthz", "GET"): "open",
    ("/readyz", "GET"): "open",
    ("/metrics", "GET"): "read any",
    ("/openapi.json", "GET"): "token",
}
PASS = {"open": set(CREDENTIALS), "token": set(SECRETS), "write": {"writer", "full"},
        "read": {"reader", "full"}, "admin": {"admin", "full"},
        "read any": {"reader", "other", "full"}}
BODIES = {("/streams/{name}", "POST"): b'{"n":1}',
          ("/streams/{name}/groups/{group}", "PUT"): b'{"to":"earliest"}'}


def refusal(need: str, who: str) -> tuple[int, str]:
    """The status and detail a credential that may not do ``need`` gets."""
    if who == "none":
        return 401, "send 'Authorization: Bearer <token>'"
    if who == "unknown":
        return 403, "this token is not accepted"
    name = NAMES[who]
    if need == "admin":
        return 403, f"token {name!r} lacks admin (the stream and consumer group life cycle)"
    if need == "read any":
        return 403, f"token {name!r} lacks read on any stream"
    return 403, f"token {name!r} lacks {need} on stream {STREAM!r}"


@pytest.fixture
def client(data_dir: Path) -> Iterator[TestClient]:
    cfg = config(data_dir, auth="on", admin=True, tokens=TOKENS, otlp_logs_stream=STREAM,
                 otlp_traces_stream=STREAM, otlp_metrics_stream=STREAM)
    with TestClient(create_app(cfg)) as c:
        yield c


def routes(client: TestClient) -> list[tuple[str, str]]:
    """Every (path, method) the app routes, HEAD included."""
    return [(route.path, method) for route in client.app.router.routes  # type: ignore[attr-defined]
            if isinstance(route, Route) for method in sorted(route.methods or ())]


def ready_stream(client: TestClient, data_dir: Path) -> None:
    """The stream with an entry and the consumer group "g" (a cell before may have
    deleted either)."""
    if client.get(f"/streams/{STREAM}/groups/g", headers=FULL).status_code == 200:
        return
    r = client.post(f"/streams/{STREAM}", content=b'{"n":0}', headers={**JSON, **FULL})
    assert r.status_code == 202, r.text
    with Log(data_dir, STORAGE) as log:
        log.group(STREAM, r.json()["shard"], "g").ack(0)


def detail(response: object) -> str:
    body = json.loads(response.content)  # type: ignore[attr-defined]
    return str(body.get("detail", body.get("message", "")))  # ours, or OTLP's google.rpc.Status


def test_every_route_against_every_token(client: TestClient, data_dir: Path) -> None:
    routed = routes(client)
    assert {(p, m) for p, m in routed if m != "HEAD"} == set(NEEDS), \
        "a route was added or removed: say in NEEDS which scope it needs"
    cells = 0
    for template, method in routed:
        need = NEEDS[(template, "GET" if method == "HEAD" else method)]
        path = template.replace("{name}", STREAM).replace("{group}", "g")
        body = BODIES.get((template, method), b"{}")
        for who, credential in CREDENTIALS.items():
            ready_stream(client, data_dir)
            headers = {**JSON, **({"authorization": credential} if credential else {})}
            r = client.request(method, path, content=body, headers=headers)
            where = f"{method} {path} as {who}: {r.status_code} {r.text}"
            if who in PASS[need]:
                assert r.status_code == (202 if (template, method) == ("/streams/{name}", "POST")
                                         else 200), where
            else:
                status, why = refusal(need, who)
                assert r.status_code == status, where
                if method != "HEAD":
                    assert detail(r) == why, where
                if status == 401:
                    assert r.headers["www-authenticate"] == "Bearer"
            if method != "HEAD":
                assert not any(s in r.text for s in SECRETS.values()), where  # never the secret
            cells += 1
    assert cells == len(routed) * len(CREDENTIALS) >= 20 * 7


def test_a_refused_write_stores_nothing_and_a_bad_name_is_still_400(client: TestClient,
                                                                     data_dir: Path) -> None:
    writer = {**JSON, "authorization": "Bearer w-secret"}
    r = client.post("/streams/logs-a", content=b'{"n":1}', headers=writer)
    assert r.status_code == 403 and r.json() == {
        "error": "forbidden", "detail": "token 'writer' lacks write on stream 'logs-a'"}
    assert stored(data_dir, "logs-a") == []
    r = client.post("/streams/bad%20name", content=b'{"n":1}', headers=writer)
    assert r.status_code == 400 and r.json()["error"] == "invalid_stream_name"


def test_the_stream_list_holds_the_readable_streams_only(client: TestClient) -> None:
    for stream in ("ev", "logs-a", "logs-b", "metrics"):
        assert client.post(f"/streams/{stream}", content=b"{}", headers={**JSON, **FULL}).status_code == 202

    def listed(secret: str) -> list[str]:
        r = client.get("/streams", headers={"authorization": f"Bearer {secret}"})
        assert r.status_code == 200, r.text
        return [s["name"] for s in r.json()["streams"]]

    assert listed("f-secret") == ["ev", "logs-a", "logs-b", "metrics"]
    assert listed("o-secret") == ["logs-a", "logs-b"]
    assert listed("r-secret") == ["ev"]


def test_patterns_match_as_fnmatch_does_case_and_all(data_dir: Path) -> None:
    tokens = (Token("t", digest_of(b"s"), write=("logs-*", "m?trics", "[ab]x")),)
    with TestClient(create_app(config(data_dir, auth="on", tokens=tokens))) as c:
        def post(stream: str) -> int:
            return c.post(f"/streams/{stream}", content=b"{}",
                          headers={**JSON, "authorization": "Bearer s"}).status_code
        assert [post(s) for s in ("logs-1", "metrics", "mxtrics", "ax", "bx")] == [202] * 5
        assert [post(s) for s in ("Logs-1", "logs", "meetrics", "cx", "xlogs-1")] == [403] * 5


def test_the_docs_table_of_scopes_is_the_code_s() -> None:
    """docs/http-api.md's table under "Scopes" says what gateway.routes.SCOPES says, row by row."""
    text = (REPO / "docs" / "http-api.md").read_text()
    section = text.split("\n## Scopes\n", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| `(\w+) ([^`]+)` \| ([^|]+?) \|", section, re.M)
    assert {(path, method): scope for method, path, scope in rows} == \
        {key: rule.describe() for key, rule in route_table.SCOPES.items()}


# ---- a real gateway ----------------------------------------------------------------------

EDGE_SECRET = "edge-secret-7f3a"


def tokens_file(edge: bool) -> str:
    """The tokens file: "edge" by its SHA-256 (write on ev), and "reader" (read on
    ev); without ``edge``, the file after revoking it."""
    edge_table = (f'[[tokens]]\nname = "edge"\nwrite = ["ev"]\n'
                  f'sha256 = "{hashlib.sha256(EDGE_SECRET.encode()).hexdigest()}"\n\n')
    return (edge_table if edge else "") + '[[tokens]]\nname = "reader"\ntoken = "reader-secret"\nread = ["ev"]\n'


def test_a_tokens_file_by_sha256_names_tokens_in_the_access_log_and_a_hup_revokes(
        tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(tokens_file(edge=True))
    conf = tmp_path / "comet.toml"
    conf.write_text(f'auth = "on"\ntokens_file = "{tokens}"\n')
    assert EDGE_SECRET not in tokens.read_text()  # the file holds the hash, not the secret
    edge = {**JSON, "authorization": f"Bearer {EDGE_SECRET}"}
    reader = {"authorization": "Bearer reader-secret"}
    with GatewayProcess(tmp_path / "data", workers=2, env=SMALL, config=conf) as server:
        server.wait_ready()
        status, body, _ = server.request("POST", "/streams/ev", b'{"n":1}', edge)
        assert status == 202, body
        status, body, _ = server.request("POST", "/streams/ev", b'{"n":2}', {**JSON, **reader})
        assert (status, json.loads(body).get("detail")) == (403, "token 'reader' lacks write on stream 'ev'")
        status, body, _ = server.request("GET", "/streams/ev/entries", None, edge)
        assert (status, json.loads(body).get("detail")) == (403, "token 'edge' lacks read on stream 'ev'")
        status, body, _ = server.request("GET", "/streams/ev/entries", None, reader)
        assert status == 200 and [e["value"] for e in json.loads(body)["entries"]] == [{"n": 1}]

        tokens.write_text(tokens_file(edge=False))
        server.reload_workers()
        for _ in range(4):  # on new connections, to any of the new workers
            status, body, _ = server.request("POST", "/streams/ev", b'{"n":3}', edge)
            assert (status, json.loads(body).get("detail")) == (403, "this token is not accepted")
        status, _, _ = server.request("GET", "/streams/ev", None, reader)
        assert status == 200
        assert server.stop() == 0
    lines = sorted((json.loads(line) for line in server.log_path.read_text().splitlines()
                    if '"event":"request"' in line), key=lambda line: float(line["ts"]))
    # A line's time is taken once the answer went out: the first two requests, answered by
    # two workers one after the other, may be logged in either order on a busy machine.
    seen = [(line["status"], line.get("token", "-")) for line in lines]
    assert sorted(seen[:2]) == [(202, "edge"), (403, "reader")] and seen[2:] == [(403, "-")] * 4
    assert EDGE_SECRET not in server.log_path.read_text()


def test_the_tokens_page_example_loads_as_shown(tmp_path: Path) -> None:
    """docs/tokens.md: its configuration and tokens file load, and the secret it
    hashes with sha256sum is the one of its edge-writers token."""
    page = REPO / "docs" / "tokens.md"
    comet, tokens = code_blocks(page, "## Giving tokens", "toml")
    (tmp_path / "tokens.toml").write_text(tokens)
    (tmp_path / "comet.toml").write_text(comet.replace("/etc/comet/tokens.toml",
                                                       str(tmp_path / "tokens.toml")))
    access = load(tmp_path / "comet.toml", env={}).access
    by_name = {t.name: t for t in access.tokens}
    assert list(by_name) == ["edge-writers", "dashboards", "ops"]
    secret = re.findall(r"printf %s '(\w+)' \| sha256sum", page.read_text())
    assert access.identify(secret[0].encode()) is by_name["edge-writers"]
    assert access.identify(b"a plain secret") is by_name["ops"] and by_name["ops"].admin
    assert access.allows(by_name["edge-writers"], "write", "logs-app")
    assert not access.allows(by_name["edge-writers"], "read", "logs-app")


def test_admin_needs_the_scope_and_the_setting(data_dir: Path) -> None:
    """A token without admin is refused for its scope; one with admin, while the
    configuration has admin off, gets admin_disabled; nothing is deleted."""
    with TestClient(create_app(config(data_dir, auth="on", tokens=TOKENS))) as c:
        assert c.post("/streams/ev", content=b"{}", headers={**JSON, **FULL}).status_code == 202
        r = c.delete("/streams/ev", headers={"authorization": "Bearer w-secret"})
        assert (r.status_code, r.json()["error"]) == (403, "forbidden")
        r = c.delete("/streams/ev", headers={"authorization": "Bearer a-secret"})
        assert (r.status_code, r.json()["error"]) == (403, "admin_disabled")
    assert stored(data_dir, "ev") == [b"{}"]
