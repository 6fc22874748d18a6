"""Body splitting without storing: the events ``Log.ingest`` would store for
a request body, found by the core's validator (comet_json_split); and the
same validator as a reader of NDJSON (``compact_ndjson``), for the export
layout's check of a payload."""

from __future__ import annotations

import threading
from array import array

from ._comet import ffi, lib
from .errors import ingest_error
from .records import Buffer, as_bytes

BODY_FORMATS = {"json": lib.COMET_BODY_JSON, "ndjson": lib.COMET_BODY_NDJSON,
                "lines": lib.COMET_BODY_LINES, "raw": lib.COMET_BODY_RAW}
"""json, ndjson: checked and split (Log.ingest); lines: one event per line that
is not empty, raw: the whole body one event, both stored unchecked."""


def body_format(name: str) -> int:
    """The COMET_BODY_* code of a body format name (ValueError for another)."""
    try:
        return BODY_FORMATS[name]
    except KeyError:
        raise ValueError(f"body format {name!r} is not one of {', '.join(BODY_FORMATS)}") from None


def split_json(body: Buffer, format: str = "json", max_entry_bytes: int = 0) -> list[bytes]:
    """The events ``Log.ingest`` would store for ``body``, without storing
    anything: validated, split, insignificant whitespace removed.  Raises
    InvalidJSON, EntryTooLarge or NoEvents with ``fault`` set."""
    body = as_bytes(body)
    req = ffi.new("comet_ingest_request *")
    res = ffi.new("comet_ingest_result *")
    keep = ffi.from_buffer(body)
    req.body = keep
    req.len = len(body)
    req.format = body_format(format)
    out = bytearray(len(body))
    lens = array("I", bytes(4 * (len(body) // 2 + 2)))
    rc = lib.comet_json_split(req, max_entry_bytes, ffi.from_buffer(out), len(out),
                              ffi.from_buffer("uint32_t[]", lens), len(lens), res)
    if rc < 0:
        raise ingest_error(rc, res)
    events, at = [], 0
    for n in lens[:rc]:
        events.append(bytes(out[at:at + n]))
        at += n
    return events


_KEEP_BYTES = 4 << 20


class _SplitScratch(threading.local):
    """Buffers for comet_json_split, grown as needed and kept per thread."""

    def __init__(self) -> None:
        self.out = bytearray(1 << 16)
        self.lens = array("I", bytes(4 * 1024))
        self.req = ffi.new("comet_ingest_request *")
        self.res = ffi.new("comet_ingest_result *")
        self.req.format = lib.COMET_BODY_NDJSON


_scratch = _SplitScratch()


def compact_ndjson(data: bytes, max_values: int) -> tuple[int, memoryview]:
    """Reads ``data`` as NDJSON with the C validator: the number of values
    and the values compacted back to back, or -1 when it is not strict
    NDJSON or holds more than ``max_values`` values."""
    s = _scratch
    out = s.out
    if len(out) < len(data):
        out = bytearray(len(data))
        if len(data) <= _KEEP_BYTES:  # kept for the next call; a rare huge one is not
            s.out = out
    if len(s.lens) < max_values + 1:
        s.lens = array("I", bytes(4 * (max_values + 1)))
    keep = ffi.from_buffer(data)
    s.req.body = keep
    s.req.len = len(data)
    rc = lib.comet_json_split(s.req, 0, ffi.from_buffer(out), len(out),
                              ffi.from_buffer("uint32_t[]", s.lens), max_values + 1, s.res)
    if rc < 0 or rc > max_values:
        return -1, memoryview(b"")
    return int(rc), memoryview(out)
