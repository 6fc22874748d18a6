"""JSON log lines, the one way every comet process writes its log.

Each record is one JSON object on one line::

    {"ts": 1795250119.257, "level": "info", "logger": "comet.gateway",
     "event": "slot_claimed", "slot": 0, "waited_s": 0.0}

Our own lines are events: a name and fields, given to ``event`` (never a
message string built with ``%r``, whose quoting is Python's, not JSON's).
Lines from other libraries (gunicorn, uvicorn, boto3, py4j) are records with
a ``message``; an exception adds ``exception`` with its traceback as text.
Values JSON cannot hold (a Path, an exception) are written as ``str()``.

It lives at the bottom of the house, in storage_c, so that the gateway, the
consumers and the Spark jobs share it without importing each other.
"""

from __future__ import annotations

import logging
import sys
import threading
from types import TracebackType
from typing import IO, Any

import orjson

FIELDS_ATTR = "comet_fields"


ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]


def event(logger: logging.Logger, name: str, level: int = logging.INFO, *,
          exc_info: bool | ExcInfo = False, **fields: object) -> None:
    """Logs the event ``name`` with ``fields`` as one JSON line."""
    if logger.isEnabledFor(level):
        logger.log(level, name, exc_info=exc_info, extra={FIELDS_ATTR: fields})


def _default(value: object) -> str:
    return str(value)


class JsonFormatter(logging.Formatter):
    """A record as one JSON object: ts, level, logger, then the event and its
    fields, or the message of a record that is not one of ours."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"ts": round(record.created, 6),
                               "level": record.levelname.lower(), "logger": record.name}
        fields = getattr(record, FIELDS_ATTR, None)
        if fields is not None:
            out["event"] = record.msg
            out.update(fields)
        else:
            out["message"] = record.getMessage()
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=_default).decode()


def handler(stream: IO[str] | None = None) -> logging.Handler:
    """A handler writing JSON lines to ``stream`` (default: stderr)."""
    out = logging.StreamHandler(stream if stream is not None else sys.stderr)
    out.setFormatter(JsonFormatter())
    return out


def capture_stray_output() -> None:
    """Python's warnings and the exceptions nobody caught (in any thread) go
    through logging too, as JSON lines, instead of as text on stderr."""
    logging.captureWarnings(True)
    crash_log = logging.getLogger("comet.uncaught")

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit or args.exc_value is None:
            return
        event(crash_log, "uncaught_exception", logging.ERROR,
              exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
              thread=args.thread.name if args.thread is not None else None)

    def main_hook(kind: type[BaseException], value: BaseException,
                  tb: TracebackType | None) -> None:
        if issubclass(kind, KeyboardInterrupt):
            sys.__excepthook__(kind, value, tb)
            return
        event(crash_log, "uncaught_exception", logging.ERROR, exc_info=(kind, value, tb),
              thread="MainThread")

    threading.excepthook = thread_hook
    sys.excepthook = main_hook


def log_to(stream: IO[str] | None = None, level: int = logging.INFO,
           quiet: tuple[str, ...] = ()) -> None:
    """Makes every logger of this process write JSON lines to ``stream``
    (a command's entry point calls it once): the root gets one JSON handler
    at ``level``, and the loggers named in ``quiet`` are raised to WARNING."""
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler(stream))
    root.setLevel(level)
    for name in quiet:
        logging.getLogger(name).setLevel(logging.WARNING)
    capture_stray_output()


def dict_config(stream: str = "ext://sys.stdout", *, silenced: tuple[str, ...] = (),
                own_handlers: tuple[str, ...] = (), level: str = "INFO") -> dict[str, Any]:
    """The same as a ``logging.config.dictConfig`` dictionary (for servers
    such as gunicorn that take one): every logger to ``stream`` as JSON lines,
    the loggers in ``silenced`` dropped.  The loggers in ``own_handlers`` are
    those the server gives handlers of its own and keeps from propagating
    (gunicorn.error): the JSON handler replaces theirs."""
    loggers: dict[str, Any] = {name: {"handlers": ["json"], "level": level, "propagate": False}
                               for name in own_handlers}
    loggers.update({name: {"handlers": [], "level": "CRITICAL", "propagate": False}
                    for name in silenced})
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": f"{__name__}.JsonFormatter"}},
        "handlers": {"json": {"class": "logging.StreamHandler", "formatter": "json",
                              "stream": stream}},
        "root": {"handlers": ["json"], "level": level},
        "loggers": loggers,
    }
