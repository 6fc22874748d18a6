"""Power cuts while ``comet ship`` forwards a stream to an OTLP/HTTP endpoint:
exactly once where the backend keeps Idempotency-Keys.

The rounds of tests/powercut/test_ship.py (shipping.py) (a writer and the real command on
the power-cut mount, cuts at random moments, during reruns too), with the
sink off the mount: a backend in the test process (the cloud, which keeps
its power), answering 2xx, or now and then storing a batch and losing the
answer.  What it stored, one body per key, is read as objects of a
directory sink are, and checked the same way after every cut: each body
holds exactly the surviving entries of its key's range (never an entry a
cut took back from the log: only durable entries are sent), per shard the
keys tile the entries without a gap or an overlap (an entry under two keys
reached the backend twice), the group's acknowledged offset never passes
what the backend holds, and after a rerun every surviving entry is there.
A key sent again must carry the same records (``check_keys``).
"""

from __future__ import annotations

import random

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from tests.support.flaky_http import Seen, Step
from tests.support.otlp_receiver import KEY, Backend, accepted

from .harness import CUTS, PowerCutFS, seeded
from .shipping import Objects, run_ship


def read_backend(backend: Backend, where: str) -> Objects:
    backend.check_keys()
    out: Objects = {}
    for key, body in backend.stored.items():
        m = KEY.match(key)
        assert m, f"{where}: a key that names no range: {key}"
        request = ExportLogsServiceRequest.FromString(body)
        lines = [r.body.string_value for group in request.resource_logs for scope in group.scope_logs
                 for r in scope.log_records]
        out.setdefault(int(m["shard"]), []).append((int(m["first"]), int(m["last"]), lines))
    return out


@pytest.mark.parametrize("mode", ["clean", "pages"])
def test_forward_exactly_once_across_power_cuts(powercut: PowerCutFS, mode: str) -> None:
    rng: random.Random = seeded(f"ship-otlp-answers-{mode}")

    def answer(seen: Seen) -> Step:
        return Step(lost=True) if rng.random() < 0.1 else accepted()

    with Backend(answer) as backend:
        run_ship(powercut, mode, CUTS, target=backend.url,
                 read=lambda where: read_backend(backend, where))
        assert backend.duplicates  # lost answers were sent again, under their keys
