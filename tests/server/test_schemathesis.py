"""Property-based fuzzing of every route in the server's own OpenAPI schema: no input gives a 5xx, and
every error is an OpenAI error object. Bounded (a few examples per operation) and derandomized, so each
run sends the same inputs. (schemathesis' pytest plugin does not load under pytest 9, so the
operations' hypothesis strategies are driven directly.)"""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402

EXAMPLES = 12


def test_no_server_errors(server):
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json", headers=server.headers)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/completions", "/v1/chat/completions", "/tokenize"}
    seen = []
    for op in operations:

        @settings(
            max_examples=EXAMPLES,
            derandomize=True,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=op.as_strategy())
        def check(case):
            response = case.call(headers=server.headers, timeout=120)
            seen.append(response.status_code)
            assert response.status_code < 500, (
                f"{case.method} {case.path} {case.body!r} -> {response.text[:500]}"
            )
            if response.status_code >= 400:
                assert set(response.json()) == {"error"}

        check()
    assert len(seen) >= len(operations) and 200 in seen
