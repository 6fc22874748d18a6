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
    import sys
    from pathlib import Path
    root = str(Path(__file__).resolve().parents[1])  # tests/ is no package a server can import
    if root not in sys.path:
        sys.path.append(root)
    from tests.support import otlp
    try:
        request = otlp.decode(signal, bytes(body))
        lines: list[bytes] = []
        rejected, reason = 0, ""
        for record in otlp.RECORDS[signal](request):
            try:
                line = orjson.dumps(record())
                if len(line) > max_event_bytes:
                    raise otlp.Rejected(f"its event takes {len(line)} bytes, above max_entry_bytes ({max_event_bytes})")
            except otlp.Rejected as exc:
                rejected, reason = rejected + 1, reason or str(exc)
                continue
            lines.append(line + b"\n")
    except otlp.Refused as exc:
        raise InvalidOTLP(str(exc)) from None
    out = b"".join(lines)
    if len(out) > max_output_bytes:
        raise BatchTooLarge(f"the events of this request take more than {max_output_bytes} bytes")
    key = otlp.service_name(signal, bytes(body))
    return Decoded(out, len(lines), rejected, reason, key.encode() if key else None)
