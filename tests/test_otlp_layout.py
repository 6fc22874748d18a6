"""The event layout loses nothing: the events of an export request turn back
into an equal request (tests/support/otlp.py's way back, compared in the
normal form: groups without records dropped, equal neighbours merged)."""

from __future__ import annotations

import math
import os
import random
import time

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from tests.support import otlp, otlp_requests
from tests.support.otlp_random import Gen

BUILDERS = {"logs": otlp_requests.logs_request, "traces": otlp_requests.traces_request,
            "metrics": otlp_requests.metrics_request}


@pytest.mark.parametrize("signal", sorted(BUILDERS))
def test_events_turn_back_into_an_equal_request(signal: str) -> None:
    body = BUILDERS[signal]().SerializeToString()
    events, rejected = otlp.events(signal, body)
    assert events and not rejected
    assert otlp.rebuilt(signal, events) == otlp.normalized(signal, body)
    assert otlp.events(signal, otlp.rebuilt(signal, events)) == (events, 0)


def test_the_comparison_sees_a_changed_value() -> None:
    """The round trip's check can fail: a bytes value read back as a string,
    a NaN as another double, a float as an integer all differ."""
    body = otlp_requests.logs_request().SerializeToString()
    events, _ = otlp.events("logs", body)
    assert any("value_types" in e for e in events)
    for change in ("bytes as string", "nan", "float as int"):
        changed = [dict(e) for e in events]
        if change == "bytes as string":
            target = next(e for e in changed if "value_types" in e and "bytes" in e["value_types"].values())
            target["value_types"] = {k: v for k, v in target["value_types"].items() if v != "bytes"}
        elif change == "nan":
            target = next(e for e in changed if "double" in e.get("value_types", {}).values())
            target["value_types"] = {k: v for k, v in target["value_types"].items() if v != "double"}
        else:
            target = changed[0]
            target["attributes"] = {**target["attributes"], "x": 1.0}
            unchanged = otlp.rebuilt("logs", changed)
            target["attributes"] = {**target["attributes"], "x": 1}
            assert otlp.rebuilt("logs", changed) != unchanged
            continue
        assert otlp.rebuilt("logs", changed) != otlp.normalized("logs", body), change


def test_nan_and_empty_values_round_trip() -> None:
    request = ExportLogsServiceRequest()
    records = request.resource_logs.add().scope_logs.add().log_records
    records.add().body.CopyFrom(AnyValue(double_value=math.nan))
    records.add().body.CopyFrom(AnyValue())          # set but empty: the same as unset
    records.add()
    body = request.SerializeToString()
    events, _ = otlp.events("logs", body)
    assert [e["body"] for e in events] == ["NaN", None, None]
    assert otlp.rebuilt("logs", events) == otlp.normalized("logs", body)


def test_random_requests_round_trip() -> None:
    """Requests of every shape (tests/support/otlp_random.py): whatever the
    reference accepts without refusing a record, and without a repeated
    attribute key (which OTLP forbids), comes back equal."""
    seed = int(os.environ.get("COMET_FUZZ_SEED", str(time.time_ns() % 2**32)))
    gen = Gen(random.Random(seed))
    checked = 0
    for case in range(600):
        signal = ("logs", "traces", "metrics")[case % 3]
        body = gen.request(signal)
        try:
            events, rejected = otlp.events(signal, body)
        except otlp.Refused:
            continue
        if rejected or otlp.has_repeated_keys(otlp.decode(signal, body)):
            continue
        where = f"COMET_FUZZ_SEED={seed} case {case} ({signal}): {body.hex()[:400]}"
        try:
            back = otlp.rebuilt(signal, events)
        except Exception as exc:
            raise AssertionError(f"{where}: {exc!r}") from exc
        assert back == otlp.normalized(signal, body), where
        checked += 1
    assert checked > 150, (seed, checked)
