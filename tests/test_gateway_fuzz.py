"""Fuzzing the gateway against its own OpenAPI document (schemathesis):
a bounded number of generated requests per operation, against a real
`comet serve` on a plain and on a TLS listener; no 500, no crash, every
status and body as documented."""

from __future__ import annotations

from pathlib import Path

import pytest
import schemathesis
import schemathesis.checks
from hypothesis import HealthCheck, given, settings
from schemathesis.core.result import Err

from .support.server import SMALL, GatewayProcess
from .support.tls import Pki

EXAMPLES = 40


@pytest.mark.slow
@pytest.mark.parametrize("listener", ["http", "tls"])
def test_api_conforms_to_its_openapi(tmp_path: Path, listener: str) -> None:
    pki = Pki.make(tmp_path / "pki") if listener == "tls" else None
    with GatewayProcess(tmp_path / "data", env={**SMALL, **(pki.env() if pki else {})},
                        tls=pki.client_context() if pki else None) as server:
        server.wait_ready()
        verify = str(pki.ca.cert) if pki else True  # requests' CA bundle: the test CA
        schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json", verify=verify)
        operations = []
        for result in schema.get_all_operations():
            if isinstance(result, Err):
                raise result.err()  # an operation the schema does not describe well enough
            operations.append(result.ok())
        assert {op.label for op in operations} >= {"POST /streams/{name}", "GET /streams/{name}/entries", "GET /metrics"}
        for operation in operations:

            @given(case=operation.as_strategy())
            @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck),
                      database=None)
            def fuzz(case: schemathesis.Case) -> None:
                # An NDJSON or octet-stream body that JSON Schema calls valid (any
                # string) may still be refused with a documented 400 - empty, or a
                # line that is not JSON - so "valid data must be accepted" is off.
                case.call_and_validate(excluded_checks=[schemathesis.checks.positive_data_acceptance],
                                       verify=verify)

            fuzz()
        assert server.proc.poll() is None, "the gateway died during fuzzing"
        assert server.stop() == 0
