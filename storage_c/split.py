"""Body splitting without storing: the events ``Log.ingest`` would store for
a request body, found by the core's validator (comet_json_split)."""

from __future__ import annotations

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
