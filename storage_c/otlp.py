"""OTLP/HTTP export requests (protobuf) into JSON events, by the core's
decoder (storage_c/src/codec/otlp.c): one event per log record, span or metric data
point, in the layout tests/support/otlp.py specifies.  The call releases the
GIL while the C code runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._comet import ffi, lib
from .errors import InvalidOTLP, raise_for
from .records import Buffer

SIGNALS = ("logs", "traces", "metrics")
STREAM_SIGNALS = {"otel-logs": "logs", "otel-traces": "traces", "otel-metrics": "metrics"}
"""The gateway's default stream of each signal: shipped as that signal
(``comet ship``, ``comet spark-ship``) unless told otherwise."""
_CODES = {"logs": lib.COMET_OTLP_LOGS, "traces": lib.COMET_OTLP_TRACES,
          "metrics": lib.COMET_OTLP_METRICS}
MAX_DEPTH: int = lib.COMET_OTLP_MAX_DEPTH
"""Nesting of arrays and maps inside one attribute value or body."""


@dataclass(frozen=True)
class Decoded:
    """What an export request holds."""

    events: bytes
    """NDJSON, one event per line, each ending in b"\\n"."""
    count: int
    """Events in ``events``."""
    rejected: int
    """Records left out (an id of the wrong length, an event above the limit)."""
    reason: str
    """Why the first rejected record was left out ("" if none was)."""
    key: bytes | None
    """service.name of the first resource (None when it has no string one)."""


def invalid_otlp(offset: int, reason: str) -> InvalidOTLP:
    exc = InvalidOTLP(f"invalid OTLP request at byte {offset}: {reason}")
    exc.offset = offset
    exc.reason = reason
    return exc


def decode(signal: str, body: Buffer, max_event_bytes: int, max_output_bytes: int = 0) -> Decoded:
    """The events of an export request of ``signal`` ("logs", "traces" or
    "metrics"); an event longer than ``max_event_bytes`` (0: no limit) is a
    rejected record.  Raises InvalidOTLP for a request refused whole, and
    BatchTooLarge when the events together would pass ``max_output_bytes``
    (0: no limit)."""
    try:
        code = _CODES[signal]
    except KeyError:
        raise ValueError(f"signal {signal!r} is not one of {', '.join(SIGNALS)}") from None
    buf = ffi.from_buffer("uint8_t[]", body)
    res = ffi.new("comet_otlp_result *")
    rc = lib.comet_otlp_decode(code, buf, len(buf), max_event_bytes, max_output_bytes, res)
    try:
        if rc == lib.COMET_E_BAD_OTLP:
            raise invalid_otlp(int(res.error_offset), ffi.string(res.reason).decode("utf-8", "replace"))
        if rc < 0:
            raise_for(rc)
        events = ffi.buffer(res.events, res.events_len)[:] if res.events_len else b""
        key = None
        if res.has_key:
            key = ffi.buffer(buf)[res.key_offset:res.key_offset + res.key_len]
        return Decoded(events, int(res.count), int(res.rejected),
                       ffi.string(res.reason).decode("utf-8", "replace") if res.rejected else "",
                       key)
    finally:
        lib.comet_otlp_free(res)


@dataclass(frozen=True)
class Encoded:
    """An export request rebuilt from stored events (``encode``)."""

    request: bytes
    """The Export*ServiceRequest, protobuf."""
    count: int
    """Records in ``request``."""
    rejected: dict[int, str]
    """Events left out (not in the layout of the signal): index in the input -> why."""


def encode(signal: str, data: Buffer, offsets: Any, timestamps: Any = None, *,
           plain_resource: bytes | None = None) -> Encoded:
    """The export request of ``signal`` holding the events ``data[offsets[i]:
    offsets[i + 1]]`` (the layout of ``ReadBatch``: int32 offsets, int64
    timestamps), by the core's encoder (storage_c/src/codec/otlp_encode.c), which
    releases the GIL.  Consecutive events of one resource and scope are one
    group.  With ``plain_resource`` (the fields of a Resource message,
    protobuf) the events are any payloads, each the body of a log record
    stamped with its timestamp."""
    try:
        code = _CODES[signal]
    except KeyError:
        raise ValueError(f"signal {signal!r} is not one of {', '.join(SIGNALS)}") from None
    count = len(offsets) - 1 if len(offsets) else 0
    plain = plain_resource is not None
    if plain and signal != "logs":
        raise ValueError("plain events are forwarded as log records only")
    res = ffi.new("comet_otlp_encoded *")
    resource = plain_resource or b""
    rc = lib.comet_otlp_encode(
        code, lib.COMET_OTLP_PLAIN if plain else 0, ffi.from_buffer("uint8_t[]", data),
        ffi.from_buffer("int32_t[]", offsets) if count else ffi.NULL,
        ffi.from_buffer("int64_t[]", timestamps) if plain and count else ffi.NULL,
        count, resource, len(resource), res)
    try:
        if rc < 0:
            raise_for(rc)
        request = ffi.buffer(res.data, res.len)[:] if res.len else b""
        rejected = {int(res.rejected_index[i]): ffi.string(
                        res.reasons + i * lib.COMET_OTLP_REASON_BYTES).decode("utf-8", "replace")
                    for i in range(res.rejected)}
        return Encoded(request, int(res.count), rejected)
    finally:
        lib.comet_otlp_encoded_free(res)
