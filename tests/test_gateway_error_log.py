"""Every answer of 500, and every storage refusal (503/507), is logged with its cause,
once per distinct cause per worker and minute (gateway/errors.py, ErrorLog), and the
server launcher fails a test whose gateway answered 500 without such a line
(tests/support/server.py, unlogged_errors, checked by GatewayProcess.stop)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import orjson
import pytest

from gateway.errors import ErrorLog
from .support.server import SMALL, GatewayProcess, unlogged_errors


def access(ts: float, status: int, slot: int = 0) -> bytes:
    return orjson.dumps({"ts": ts, "level": "info", "logger": "comet.gateway.access",
                         "event": "request", "method": "POST", "path": "/streams/x",
                         "status": status, "events": 0, "ms": 1.0, "slot": slot})


def cause(ts: float, slot: int = 0, status: int = 500) -> bytes:
    return orjson.dumps({"ts": ts, "level": "error", "logger": "comet.gateway.errors",
                         "event": "error_answer", "status": status, "error": "storage_error",
                         "detail": "x", "path": "/streams/x", "slot": slot, "repeats": 0})


@pytest.mark.parametrize("lines, silent", [
    ([access(100, 202), access(101, 503)], 0),              # no 500 at all
    ([access(100, 500)], 1),                                # a 500 nobody explained
    ([cause(99.9), access(100, 500), access(150, 500)], 0),  # one line covers a minute
    ([cause(10), access(100, 500)], 1),                     # ... not more
    ([cause(99.9, slot=1), access(100, 500, slot=0)], 1),   # another worker's line
    ([cause(99.9, status=503), access(100, 500)], 1),       # a line about a 503
])
def test_unlogged_errors_finds_a_silent_500(tmp_path: Path, lines: list[bytes],
                                            silent: int) -> None:
    log = tmp_path / "serve.log"
    log.write_bytes(b"\n".join(lines) + b"\n")
    assert len(unlogged_errors(log)) == silent


def test_error_log_once_per_cause_and_minute(caplog: pytest.LogCaptureFixture,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr("gateway.errors.time.monotonic", lambda: now[0])
    errors = ErrorLog()
    with caplog.at_level(logging.INFO, logger="comet.gateway.errors"):
        for i in range(50):  # the same cause; numbers alone do not make another
            errors.answered(500, "storage_error", f"entry {i} is damaged", "/streams/a", 0)
        errors.answered(500, "storage_error", "segment shard-0002/1.log is damaged", "/s", 0)
        errors.answered(500, "storage_error", "segment shard-0003/1.log is damaged", "/s", 0)
        errors.answered(503, "busy", "retry later", "/s", 0)           # not a fault: no line
        errors.answered(507, "storage_full", "the disk is full", "/s", 0)
        now[0] += 61
        errors.answered(500, "storage_error", "entry 7 is damaged", "/streams/a", 0)
    fields = [r.comet_fields for r in caplog.records]  # type: ignore[attr-defined]
    assert [(f["status"], f["detail"], f["repeats"]) for f in fields] == [
        (500, "entry 0 is damaged", 0),
        (500, "segment shard-0002/1.log is damaged", 0),
        (500, "segment shard-0003/1.log is damaged", 0),
        (507, "the disk is full", 0),
        (500, "entry 7 is damaged", 49),
    ]


def test_a_real_500_is_logged_once(data_dir: Path) -> None:
    """A damaged stream metadata file answers 500 storage_error to every request: one
    line per worker says why, and stopping the server finds nothing silent."""
    broken = data_dir / "broken"
    broken.mkdir(parents=True)
    (broken / "stream.meta").write_bytes(b"\x00" * 64)
    with GatewayProcess(data_dir, env=SMALL) as server:
        server.wait_ready()
        for _ in range(30):
            status, body, _ = server.request("POST", "/streams/broken", b"{}",
                                             {"content-type": "application/json"})
            assert status == 500 and json.loads(body)["error"] == "storage_error", body
        server.stop()  # raises if a 500 had no line (the access log is on in SMALL)
    text = server.log_path.read_bytes().splitlines()
    answers = [json.loads(x) for x in text if b'"event":"request"' in x]
    lines = [json.loads(x) for x in text if b'"event":"error_answer"' in x]
    assert sum(a["status"] == 500 for a in answers) == 30
    assert 1 <= len(lines) <= 2 and all("stream.meta" in r["detail"] for r in lines), lines
