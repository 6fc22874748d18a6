"""Every line a gateway writes is one JSON object: its own events (under the
comet.gateway loggers), gunicorn's and uvicorn's lines, and the access log,
through a start with a worker that must wait for its process slot, good and
bad requests, a 507, a reload with a good and one with a broken configuration
file, and a stop."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from gateway.app import create_app
from comet.jsonlog import JsonFormatter
from storage_c import Config, Log

from .support.gateway_app import config
from .support.server import SMALL, GatewayProcess

JSON = {"content-type": "application/json"}
SEGMENT = 64 << 10
STORAGE = {"COMET_STORAGE_SHARDS": "1", "COMET_STORAGE_SEGMENT_BYTES": str(SEGMENT),
           "COMET_STORAGE_RETENTION_MAX_TOTAL_BYTES": str(8 * SEGMENT)}


def records(path: Path) -> list[dict[str, Any]]:
    """Every line of the log (the server's stdout and stderr) as a JSON object."""
    out = []
    for number, line in enumerate(path.read_bytes().splitlines(), 1):
        try:
            record = json.loads(line)
        except ValueError:
            raise AssertionError(f"line {number} is not JSON: {line[:300]!r}") from None
        assert isinstance(record, dict), f"line {number} is not a JSON object: {line[:300]!r}"
        out.append(record)
    return out


def test_every_line_of_a_gateway_run_is_json(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Log(data, Config(shards=1, segment_bytes=SEGMENT, process_count=2)) as log:
        log.create_stream("full", 1)
        log.group("full", 0, "slow")  # what it has not consumed may not be deleted
    conf = tmp_path / "comet.toml"
    conf.write_text("max_body_bytes = 100000\n")
    holder = Log(data, Config(process_count=2, background_flush=False), claim_slot=True)
    try:
        server = GatewayProcess(data, workers=2, config=conf,
                                env={**SMALL, **STORAGE, "COMET_ACCESS_LOG": "1"})
    except BaseException:
        holder.close()
        raise
    with server:
        server.wait_for_log('"event":"waiting_for_slot"')  # one worker has no slot yet
        holder.close()
        server.wait_ready()
        statuses = {server.request(method, path, body, headers)[0] for method, path, body, headers in [
            ("POST", "/streams/ev", b'{"a": 1}', JSON),
            ("POST", "/streams/ev", b'{"a": ', JSON),
            ("POST", "/streams/ev", b"<a/>", {"content-type": "text/xml"}),
            ("GET", "/streams/ev/entries", None, {}),
            ("GET", "/streams/ev/nothing", None, {}),
            ("PATCH", "/streams/ev", b"{}", JSON),
            ("GET", "/metrics", None, {}),
        ]}
        assert statuses == {202, 400, 415, 200, 404, 405}
        for i in range(2000):
            status, body, _ = server.request("POST", "/streams/full", b'{"pad": "%s"}' % (b"p" * 4000), JSON)
            if status != 202:
                break
        assert status == 507, body
        conf.write_text("max_body_bytes = 200000\n")
        server.reload_workers()
        conf.write_text("max_body_bytes = [not toml\n")
        server.reload_workers()
        assert server.stop() == 0
    lines = records(server.log_path)
    events = {r["event"] for r in lines if "event" in r}
    assert {"waiting_for_slot", "slot_claimed", "request", "reload_config_invalid",
            "final_stop"} <= events, events
    for r in lines:
        assert list(r)[:3] == ["ts", "level", "logger"], r
        assert ("event" in r) != ("message" in r), r
        if "event" in r:  # ours
            assert r["logger"].startswith("comet.gateway."), r
    loggers = {r["logger"] for r in lines}
    assert {"gunicorn.error", "uvicorn.error", "comet.gateway.access", "comet.gateway.runtime",
            "comet.gateway.server", "comet.gateway.worker"} <= loggers
    invalid = [r for r in lines if r.get("event") == "reload_config_invalid"]
    assert invalid[0]["level"] == "error" and "comet.toml" in invalid[0]["error"]
    access = [r for r in lines if r.get("event") == "request"]
    assert {r["status"] for r in access} >= {202, 400, 415, 507}


def test_an_unexpected_error_is_logged_as_json_with_its_traceback(
        data_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from gateway import reads

    def broken(*args: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(reads, "list_streams", broken)
    with TestClient(create_app(config(data_dir))) as c, caplog.at_level(logging.ERROR):
        r = c.get("/streams")
    assert r.status_code == 500 and r.json()["error"] == "internal"
    [record] = [r for r in caplog.records if r.name == "comet.gateway.app"]
    line = json.loads(JsonFormatter().format(record))
    assert line["event"] == "internal_error" and line["path"] == "/streams"
    assert "RuntimeError: a bug" in line["exception"]
