"""Schemathesis against the published OpenAPI: generated requests (valid and invalid) never get a 5xx.

Bounded on purpose (a few examples per operation and mode, ~200 requests per database) so it fits
the suite's time budget; NEFFCACHE_FUZZ_EXAMPLES=150 runs a deeper search (passed, ~5 minutes).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from tests.server.conftest import LiveServer, Tokens

# Read at import: the suite's autouse fixture clears NEFFCACHE_* variables before each test.
EXAMPLES = int(os.environ.get("NEFFCACHE_FUZZ_EXAMPLES", "6"))


def _fuzz(operation: schemathesis.APIOperation, mode: GenerationMode, base_url: str, headers: dict[str, str],
          calls: list[int]) -> Callable[[], None]:
    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: schemathesis.Case) -> None:
        response = case.call(base_url=base_url, headers=headers)
        calls.append(response.status_code)
        checks = [not_a_server_error]
        if mode is GenerationMode.POSITIVE and response.status_code < 300:
            checks.append(response_schema_conformance)
        case.validate_response(response, checks=checks)

    return run  # type: ignore[no-any-return]


@pytest.mark.slow
def test_no_server_errors(server: LiveServer, tokens: Tokens) -> None:
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 12
    headers = {"Authorization": f"Bearer {tokens.admin}"}
    failures: list[str] = []
    calls: list[int] = []
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                _fuzz(operation, mode, server.url, headers, calls)()
            except Unsatisfiable:
                assert mode is GenerationMode.NEGATIVE  # nothing to get wrong in a parameterless GET
            except Exception as exc:  # every operation is tried; failures are listed together
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                failures.append(f"{operation.label} [{mode.value}]: {type(exc).__name__}: {first}")
    assert not failures, "\n".join(failures)
    assert len(calls) >= len(operations) * 4  # the search really ran
    assert any(200 <= c < 300 for c in calls) and any(400 <= c < 500 for c in calls)
