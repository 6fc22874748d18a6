"""HTTP errors of the gateway: every one is JSON ``{"error": code, "detail": text}``.

``STORAGE_ERRORS`` is the one table from the storage's exceptions to HTTP
statuses: every exception class of storage_c has a row of its own (a test
walks them), so a new storage error is mapped on purpose, not by accident.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Hashable, NamedTuple

import orjson
from starlette.responses import Response

import storage_c
from comet.jsonlog import event
from storage_c import CometError, check_stream_name


class HTTPError(Exception):
    """Raised by handlers; answered as a JSON error body (``body``, ``response``)."""

    def __init__(self, status: int, code: str, detail: str, *, retry_after: int | None = None,
                 headers: dict[str, str] | None = None, extra: dict[str, object] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.extra = extra or {}
        self.headers = dict(headers or {})
        if retry_after is not None:
            self.headers["Retry-After"] = str(retry_after)

    def body(self) -> bytes:
        return orjson.dumps({"error": self.code, "detail": self.detail, **self.extra})

    def response(self) -> Response:
        return Response(self.body(), status_code=self.status, media_type="application/json",
                        headers=self.headers)


class ErrorAnswer(NamedTuple):
    status: int
    code: str
    retry: bool = False
    """Whether the answer carries Retry-After: the same request may succeed later."""


INTERNAL = ErrorAnswer(500, "storage_error")

STORAGE_ERRORS: dict[type[CometError], ErrorAnswer] = {
    # the request is wrong
    storage_c.StreamNameError: ErrorAnswer(400, "invalid_stream_name"),
    storage_c.GroupNameError: ErrorAnswer(400, "invalid_group_name"),
    storage_c.ShardRangeError: ErrorAnswer(400, "bad_parameter"),
    storage_c.InvalidArgument: ErrorAnswer(400, "bad_parameter"),
    storage_c.InvalidJSON: ErrorAnswer(400, "invalid_json"),
    storage_c.InvalidOTLP: ErrorAnswer(400, "invalid_otlp"),
    storage_c.NoEvents: ErrorAnswer(400, "empty_body"),
    storage_c.EntryTooLarge: ErrorAnswer(413, "event_too_large"),
    storage_c.BatchTooLarge: ErrorAnswer(413, "batch_too_large"),
    storage_c.StreamNotFound: ErrorAnswer(404, "unknown_stream"),
    storage_c.GroupNotFound: ErrorAnswer(404, "unknown_group"),
    storage_c.StreamLimit: ErrorAnswer(409, "too_many_streams"),
    storage_c.TooManyGroups: ErrorAnswer(409, "too_many_groups"),
    storage_c.IdempotencyKeyReused: ErrorAnswer(422, "idempotency_key_reused"),
    # the gateway cannot take it now; later it may
    storage_c.StorageFull: ErrorAnswer(507, "storage_full", retry=True),
    storage_c.NoFreeSlot: ErrorAnswer(503, "starting", retry=True),
    storage_c.Closed: ErrorAnswer(503, "draining", retry=True),
    # (the ingest path makes the call again on a thread before it answers this)
    storage_c.WouldBlock: ErrorAnswer(503, "busy", retry=True),
    # every open shard of the worker is in use (max_open_shards): one is free soon
    storage_c.TooManyOpenShards: ErrorAnswer(503, "too_many_open_shards", retry=True),
    # the storage refuses writes until an operator acts (the detail names the cause)
    storage_c.SyncFailed: ErrorAnswer(503, "sync_failed", retry=True),
    storage_c.StorageGone: ErrorAnswer(503, "storage_gone", retry=True),
    storage_c.ReadOnlyStorage: ErrorAnswer(503, "storage_read_only", retry=True),
    # the storage itself is in trouble, or a request reached what HTTP never asks for
    CometError: INTERNAL,
    storage_c.StorageIOError: INTERNAL,
    storage_c.CorruptionError: INTERNAL,
    storage_c.DecompressionError: INTERNAL,
    storage_c.FormatVersionError: INTERNAL,
    storage_c.ShardCountMismatch: INTERNAL,
    storage_c.ProcessCountMismatch: INTERNAL,
    storage_c.SlotAlreadyHeld: INTERNAL,
    storage_c.AckGapError: INTERNAL,
}


def mapping_of(exc: CometError) -> ErrorAnswer:
    """The row of the exception's class, or of its nearest mapped base."""
    for cls in type(exc).__mro__:
        row = STORAGE_ERRORS.get(cls)
        if row is not None:
            return row
    return INTERNAL


def storage_error(exc: CometError, retry_after_s: int, detail: str | None = None,
                  extra: dict[str, object] | None = None) -> HTTPError:
    """The HTTP answer to a storage error (``detail``: instead of its message)."""
    row = mapping_of(exc)
    return HTTPError(row.status, row.code, str(exc) if detail is None else detail,
                     retry_after=retry_after_s if row.retry else None, extra=extra)


LOGGED_PATH_CHARS = 256
"""Paths in log lines are cut to this many characters: a client chooses them, and a line
must stay one write (operations.md, Logs)."""


def clipped(path: str) -> str:
    """``path`` as a log line shows it: at most LOGGED_PATH_CHARS, a cut one ending in "..."."""
    return path if len(path) <= LOGGED_PATH_CHARS else path[:LOGGED_PATH_CHARS - 3] + "..."


_valid_names: set[str] = set()


def check_name(stream: str) -> None:
    """400 ``invalid_stream_name`` unless ``stream`` is a valid stream name
    (the names seen valid are remembered: the ingest path asks per request)."""
    if stream in _valid_names:
        return
    try:
        check_stream_name(stream)
    except CometError as exc:
        raise storage_error(exc, 0) from None
    if len(_valid_names) < 10_000:
        _valid_names.add(stream)


# ---- the error log: the cause of every answer an operator must hear of ----------------

LOGGED_CODES = frozenset({"storage_gone", "storage_read_only", "sync_failed", "storage_full"})
"""Answers below 500 that are logged too: the storage refusing writes until someone acts."""

# Numbers standing alone (an entry number, a byte count) do not make a cause of their
# own; those inside a path or a name (shard-0002, 00000000000000002000.log) do.
LONE_NUMBER = re.compile(r"(?<![\w/.-])\d+(?![\w/.-])")

error_log = logging.getLogger("comet.gateway.errors")


class CauseLog:
    """One line (``name`` at ``level``) per distinct cause per ``every`` seconds in this
    worker, with ``repeats``: the times the cause came again since its previous line.  A
    fault, or a client that keeps trying, repeats itself, and thousands of identical lines
    would hide it as well as none.  At most MAX_CAUSES causes are remembered (the oldest
    is forgotten first), so what clients send cannot grow it."""

    MAX_CAUSES = 1000

    def __init__(self, logger: logging.Logger, name: str, level: int, every: float = 60.0) -> None:
        self.logger = logger
        self.name = name
        self.level = level
        self.every = every
        self.causes: dict[Hashable, list[float]] = {}  # cause -> [logged at, repeats]

    def note(self, cause: Hashable, **fields: object) -> bool:
        """The cause happened: logged with ``fields`` unless it was within ``every``
        seconds (then counted); True when a line was written."""
        now = time.monotonic()
        seen = self.causes.get(cause)
        if seen is not None and now - seen[0] < self.every:
            seen[1] += 1
            return False
        repeats = int(seen[1]) if seen is not None else 0
        if seen is None and len(self.causes) >= self.MAX_CAUSES:
            self.causes.pop(next(iter(self.causes)))  # the oldest cause
        self.causes[cause] = [now, 0]
        fields["repeats"] = repeats
        # mypy takes a field for event's exc_info; none is called that
        event(self.logger, self.name, self.level, **fields)  # type: ignore[arg-type]
        return True


class ErrorLog(CauseLog):
    """One JSON line (event "error_answer") per distinct cause of a 500, or of a 503/507
    in LOGGED_CODES, per ``every`` seconds in this worker (CauseLog).  The line carries
    the status, the error code, the detail (the cause), the path, the worker's slot, and
    ``repeats``: the answers of the same cause since its previous line."""

    def __init__(self, every: float = 60.0) -> None:
        super().__init__(error_log, "error_answer", logging.ERROR, every)

    def answered(self, status: int, code: str, detail: str, path: str,
                 slot: int | None) -> None:
        if status != 500 and code not in LOGGED_CODES:
            return
        self.note((status, code, LONE_NUMBER.sub("N", detail)), status=status, error=code,
                  detail=detail, path=clipped(path), slot=slot)


errors_answered = ErrorLog()
"""The worker's one error log (every path that answers goes through it)."""
