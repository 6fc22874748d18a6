"""The way back, differentially: stored events turned into an export request
by the core's encoder (storage_c/src/codec/otlp_encode.c) are the request the
reference rebuilds (tests/support/otlp.py ``request_from_events``), for
requests of every shape; and OTLP/JSON (consumers/otlp_sink.to_json) says
the same as the protobuf.  The encoder's own edge cases, under the
sanitizers, are storage_c/tests/test_otlp_encode.c."""

from __future__ import annotations

import os
import random
import time
from array import array

import orjson
import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from consumers.otlp_sink import to_json
from storage_c import decode_otlp
from storage_c.otlp import encode

from .support import otlp
from .support.flaky_http import Seen
from .support.otlp_random import Gen
from .support.otlp_receiver import request_bytes


def columns(events: list[bytes]) -> tuple[bytes, array]:
    offsets = array("i", [0])
    for e in events:
        offsets.append(offsets[-1] + len(e))
    return b"".join(events), offsets


def test_random_requests_come_back_as_the_reference_rebuilds_them() -> None:
    seed = int(os.environ.get("COMET_FUZZ_SEED", str(time.time_ns() % 2**32)))
    gen = Gen(random.Random(seed))
    checked = 0
    for case in range(900):
        signal = ("logs", "traces", "metrics")[case % 3]
        body = gen.request(signal)
        try:
            events, rejected = otlp.events(signal, body)
        except otlp.Refused:
            continue
        if rejected or otlp.has_repeated_keys(otlp.decode(signal, body)):
            continue
        stored = decode_otlp(signal, body, 0).events.split(b"\n")[:-1]
        encoded = encode(signal, *columns(stored))
        where = f"COMET_FUZZ_SEED={seed} case {case} ({signal}): {body.hex()[:300]}"
        assert not encoded.rejected and encoded.count == len(stored), (where, encoded.rejected)
        mine = otlp._canonical(otlp.decode(signal, encoded.request)).SerializeToString(deterministic=True)
        assert mine == otlp.rebuilt(signal, events), where
        assert encode(signal, *columns(stored)).request == encoded.request  # deterministic
        checked += 1
    assert checked > 300, (seed, checked)


def test_the_check_can_fail() -> None:
    """A changed stored value gives another request (the check above sees it)."""
    body = ExportLogsServiceRequest()
    record = body.resource_logs.add().scope_logs.add().log_records.add(time_unix_nano=5)
    record.body.string_value = "x"
    stored = decode_otlp("logs", body.SerializeToString(), 0).events.split(b"\n")[:-1]
    changed = [stored[0].replace(b'"body":"x"', b'"body":"y"')]
    a, b = encode("logs", *columns(stored)), encode("logs", *columns(changed))
    assert a.request != b.request and a.count == b.count == 1


@pytest.mark.parametrize("signal", ["logs", "traces", "metrics"])
def test_otlp_json_says_what_the_protobuf_says(signal: str) -> None:
    gen = Gen(random.Random(11))
    done = 0
    while done < 40:
        body = gen.request(signal)
        try:
            otlp.decode(signal, body)
        except otlp.Refused:
            continue
        doc = to_json(signal, body)
        for key in (b'"traceId":"', b'"spanId":"'):
            at = doc.find(key)
            if at >= 0:  # ids in hex, as OTLP/JSON wants
                value = doc[at + len(key):doc.index(b'"', at + len(key))]
                assert all(c in b"0123456789abcdef" for c in value), value
        seen = Seen(0.0, f"/v1/{signal}", {"content-type": "application/json"}, doc)
        back = request_bytes(seen)
        assert otlp.decode(signal, back).SerializeToString(deterministic=True) == \
            otlp.decode(signal, body).SerializeToString(deterministic=True)
        assert isinstance(orjson.loads(doc), dict)  # strict JSON
        done += 1
