"""The routes: every one is in the OpenAPI document and the document holds no
other; a wrong method on a route is 405 with Allow, a path that is no route
404, and neither is ever answered as a bad stream name; one consumer group
can be read on its own."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
from starlette.testclient import TestClient

from gateway import openapi, routes
from gateway.app import create_app
from storage_c import Log

from .support.gateway_app import JSON, STORAGE, config, stored

METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS")


@pytest.fixture
def client(data_dir: Path) -> Iterator[TestClient]:
    with TestClient(create_app(config(data_dir))) as c:
        yield c


def routed(client: TestClient) -> set[tuple[str, str]]:
    return set(openapi.operations(client.app.router.routes))  # type: ignore[attr-defined]  # a GatewayApp


def documented(client: TestClient) -> set[tuple[str, str]]:
    paths = client.get("/openapi.json").json()["paths"]
    return {(path, method.upper()) for path, ops in paths.items() for method in ops}


def test_the_document_describes_every_route_and_nothing_else(client: TestClient) -> None:
    assert routed(client) == documented(client)
    assert set(routes.SCOPES) == routed(client)  # every route of the table, and only those
    assert {("/streams/{name}/groups", "GET"), ("/streams/{name}/groups/{group}", "PUT"),
            ("/streams/{name}/groups/{group}", "DELETE"), ("/streams/{name}", "DELETE"),
            ("/streams/{name}/groups/{group}", "GET")} <= documented(client)


def test_a_route_is_declared_with_one_handler() -> None:
    """A route of the table has a Starlette endpoint or a plain ASGI route, never both or
    neither; its scope and its description are required fields of the declaration."""
    operation = routes.TABLE[1]
    with pytest.raises(TypeError, match="GET /streams/{name}: give an endpoint or a plain route"):
        routes.Operation(operation.path, operation.method, operation.scope, operation.describe)
    with pytest.raises(TypeError, match="give an endpoint or a plain route"):
        routes.Operation(operation.path, operation.method, operation.scope, operation.describe,
                         operation.endpoint, routes.TABLE[0].plain)


def allowed(client: TestClient, template: str) -> set[str]:
    methods = {m for path, m in routed(client) if path == template}
    return methods | ({"HEAD"} if "GET" in methods else set())


def test_a_wrong_method_on_a_route_is_405_with_allow(client: TestClient, data_dir: Path) -> None:
    client.post("/streams/ev", content=b"{}", headers=JSON)
    templates = {path for path, _ in routed(client)}
    for template in templates:
        path = template.replace("{name}", "ev").replace("{group}", "g")
        for method in set(METHODS) - allowed(client, template):
            r = client.request(method, path, content=b"{}", headers=JSON)
            assert r.status_code == 405, (method, path, r.text)
            assert r.headers["allow"] == ", ".join(sorted(allowed(client, template)))
            if method != "HEAD":
                body = r.json()
                assert body["error"] == "method_not_allowed" and path in body["detail"]
    assert stored(data_dir, "ev") == [b"{}"]  # nothing else was stored


def test_no_method_and_path_is_answered_as_a_bad_stream_name(client: TestClient) -> None:
    """The stream names below are all valid: whatever the method and the
    path, the answer is about the route, not about the name."""
    client.post("/streams/ev", content=b"{}", headers=JSON)
    paths = ["/streams/ev", "/streams/ev/entries", "/streams/ev/groups", "/streams/ev/groups/g",
             "/streams/events/groups/nosuch", "/streams/ev/nothing", "/streams/ev/groups/g/more",
             "/streams/ev/entries/1", "/streams"]
    for path in paths:
        for method in METHODS:
            r = client.request(method, path, content=b"{}", headers=JSON)
            if method != "HEAD" and r.status_code >= 400:
                assert r.json()["error"] != "invalid_stream_name", (method, path, r.text)


def test_read_one_consumer_group(data_dir: Path) -> None:
    app = create_app(config(data_dir))
    with TestClient(app) as c:
        first = c.post("/streams/events", content=b"[1,2,3]", headers=JSON).json()
        c.post("/streams/events", content=b"[4]", headers=JSON)
        r = c.get("/streams/events/groups/nosuch")
        assert r.status_code == 404 and r.json()["error"] == "unknown_group"
        assert r.json()["detail"] == \
            "consumer group 'nosuch' is not registered in stream 'events' (it has none)"
        with Log(data_dir, STORAGE) as log:
            log.group("events", first["shard"], "readers").ack(0)
        got = c.get("/streams/events/groups/readers").json()
        assert got["stream"] == "events" and got["name"] == "readers" and got["lag"] == 2
        assert [(s["shard"], s["offset"], s["lag"]) for s in got["shards"]] == \
            [(first["shard"], 1, 2)]
        assert c.get("/streams/events/groups").json()["groups"] == [
            {k: v for k, v in got.items() if k != "stream"}]
        assert "(known: readers)" in c.get("/streams/events/groups/other").json()["detail"]
        r = c.get("/streams/events/groups/bad%20name")
        assert r.status_code == 400 and r.json()["error"] == "invalid_group_name"
        r = c.get("/streams/nosuch/groups/readers")
        assert r.status_code == 404 and r.json()["error"] == "unknown_stream"


def test_deleting_with_admin_off_is_403(client: TestClient) -> None:
    client.post("/streams/x", content=b"{}", headers=JSON)
    r = client.delete("/streams/x")
    assert r.status_code == 403 and r.json()["error"] == "admin_disabled"
    assert "admin = true" in r.json()["detail"]
    assert client.get("/streams/x").status_code == 200
