"""comet.jsonlog: every line a command writes is one JSON object, its own
events, other libraries' messages, warnings and uncaught exceptions alike."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from comet.jsonlog import JsonFormatter, event

PROGRAM = textwrap.dedent("""
    import logging, sys, threading, warnings
    from pathlib import Path
    from comet.jsonlog import event, log_to

    log_to(sys.stderr)
    event(logging.getLogger("comet.test"), "started", path=Path("/x"), n=1)
    logging.getLogger("some.library").warning("a %s message", "plain")
    warnings.warn("something is deprecated", DeprecationWarning)
    worker = threading.Thread(target=lambda: 1 / 0, name="worker-1")
    worker.start()
    worker.join()
    raise RuntimeError("the end")
""")


def test_every_line_of_a_command_is_a_json_object() -> None:
    out = subprocess.run([sys.executable, "-W", "always", "-c", PROGRAM], capture_output=True,
                         text=True, timeout=60, cwd=Path(__file__).parent.parent)
    assert out.returncode == 1
    assert out.stdout == ""
    records = [json.loads(line) for line in out.stderr.splitlines()]
    assert all(isinstance(r, dict) for r in records)
    first, library, warning, thread, main = records
    assert first["event"] == "started" and first["path"] == "/x" and first["n"] == 1
    assert first["logger"] == "comet.test" and first["level"] == "info"
    assert library["message"] == "a plain message" and library["level"] == "warning"
    assert warning["logger"] == "py.warnings" and "something is deprecated" in warning["message"]
    assert thread["event"] == "uncaught_exception" and thread["thread"] == "worker-1"
    assert "ZeroDivisionError" in thread["exception"]
    assert main["event"] == "uncaught_exception" and "RuntimeError: the end" in main["exception"]


def test_an_event_has_the_fields_it_was_given(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("comet.test.fields")
    with caplog.at_level(logging.INFO, logger="comet.test.fields"):
        event(logger, "shipped", key="a/b.ndjson.zst", bytes=10, quote='he said "hi"')
    line = JsonFormatter().format(caplog.records[0])
    assert json.loads(line) == {"ts": json.loads(line)["ts"], "level": "info",
                                "logger": "comet.test.fields", "event": "shipped",
                                "key": "a/b.ndjson.zst", "bytes": 10, "quote": 'he said "hi"'}
