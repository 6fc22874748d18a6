# TEMPORARY SHIM until the C decoder lands (branch otlp-c replaces this file): the oracle behind its API.
from __future__ import annotations
from dataclasses import dataclass
import orjson
from .errors import CometError, BatchTooLarge

SIGNALS = ("logs", "traces", "metrics")

class InvalidOTLP(CometError):
    pass

@dataclass(frozen=True)
class Decoded:
    events: bytes
    count: int
    rejected: int
    reason: str
    key: bytes | None

def decode(signal: str, body: bytes | bytearray | memoryview, max_event_bytes: int, max_output_bytes: int) -> Decoded:
    from tests.support import otlp
    try:
        evs, rejected = otlp.events(signal, bytes(body))
    except otlp.Refused as exc:
        raise InvalidOTLP(str(exc)) from None
    lines = b"".join(orjson.dumps(e) + b"\n" for e in evs)
    if len(lines) > max_output_bytes:
        raise BatchTooLarge(f"the events of this request take more than {max_output_bytes} bytes")
    key = otlp.service_name(signal, bytes(body))
    return Decoded(lines, len(evs), rejected, "some record" if rejected else "", key.encode() if key else None)
