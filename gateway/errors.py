"""HTTP errors of the gateway: every one is JSON ``{"error": code, "detail": text}``.

``STORAGE_ERRORS`` is the one table from the storage's exceptions to HTTP
statuses: every exception class of storage_c has a row of its own (a test
walks them), so a new storage error is mapped on purpose, not by accident.
"""

from __future__ import annotations

from typing import NamedTuple

import orjson
from starlette.responses import Response

from storage_c import (
    AckGapError,
    BatchTooLarge,
    Closed,
    CometError,
    CorruptionError,
    DecompressionError,
    EntryTooLarge,
    FormatVersionError,
    GroupNameError,
    GroupNotFound,
    InvalidArgument,
    InvalidJSON,
    NoEvents,
    NoFreeSlot,
    ProcessCountMismatch,
    ShardCountMismatch,
    ShardRangeError,
    SlotAlreadyHeld,
    StorageFull,
    StorageIOError,
    StreamLimit,
    StreamNameError,
    StreamNotFound,
    TooManyGroups,
    WouldBlock,
    check_stream_name,
)


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
    StreamNameError: ErrorAnswer(400, "invalid_stream_name"),
    GroupNameError: ErrorAnswer(400, "invalid_group_name"),
    ShardRangeError: ErrorAnswer(400, "bad_parameter"),
    InvalidArgument: ErrorAnswer(400, "bad_parameter"),
    InvalidJSON: ErrorAnswer(400, "invalid_json"),
    NoEvents: ErrorAnswer(400, "empty_body"),
    EntryTooLarge: ErrorAnswer(413, "event_too_large"),
    BatchTooLarge: ErrorAnswer(413, "batch_too_large"),
    StreamNotFound: ErrorAnswer(404, "unknown_stream"),
    GroupNotFound: ErrorAnswer(404, "unknown_group"),
    StreamLimit: ErrorAnswer(409, "too_many_streams"),
    TooManyGroups: ErrorAnswer(409, "too_many_groups"),
    # the gateway cannot take it now; later it may
    StorageFull: ErrorAnswer(507, "storage_full", retry=True),
    NoFreeSlot: ErrorAnswer(503, "starting", retry=True),
    Closed: ErrorAnswer(503, "draining", retry=True),
    WouldBlock: ErrorAnswer(503, "busy", retry=True),  # the ingest path retries it on a thread first
    # the storage itself is in trouble, or a request reached what HTTP never asks for
    CometError: INTERNAL,
    StorageIOError: INTERNAL,
    CorruptionError: INTERNAL,
    DecompressionError: INTERNAL,
    FormatVersionError: INTERNAL,
    ShardCountMismatch: INTERNAL,
    ProcessCountMismatch: INTERNAL,
    SlotAlreadyHeld: INTERNAL,
    AckGapError: INTERNAL,
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
