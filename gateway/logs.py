"""Structured logs: one JSON object per line on stdout, for the access log
(one line per ingest request, written straight to the file descriptor so
that lines from several workers never interleave) and for everything that goes
through the logging module (gunicorn's and ours)."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import orjson


def access(fields: dict[str, Any]) -> None:
    fields["ts"] = time.time()
    os.write(1, orjson.dumps(fields) + b"\n")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"ts": record.created, "level": record.levelname.lower(),
                               "logger": record.name}
        message = record.getMessage()
        try:  # our own messages are JSON objects already: merge them
            parsed = orjson.loads(message)
            if isinstance(parsed, dict):
                out.update(parsed)
            else:
                out["message"] = message
        except orjson.JSONDecodeError:
            out["message"] = message
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(out).decode()


LOGCONFIG: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": "gateway.logs.JsonFormatter"}},
    "handlers": {"stdout": {"class": "logging.StreamHandler", "formatter": "json",
                            "stream": "ext://sys.stdout"}},
    "root": {"handlers": ["stdout"], "level": "INFO"},
    "loggers": {
        "gunicorn.error": {"handlers": ["stdout"], "level": "INFO", "propagate": False},
        "gunicorn.access": {"handlers": [], "level": "CRITICAL", "propagate": False},
        "uvicorn.error": {"handlers": ["stdout"], "level": "INFO", "propagate": False},
        "uvicorn.access": {"handlers": [], "level": "CRITICAL", "propagate": False},
    },
}
