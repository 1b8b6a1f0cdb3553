"""/openapi.json describes what the server answers (#28 item 8): the probes' empty 200, /metrics' text,
the streamed responses' event stream and the 401/503 error objects, checked by schemathesis' response
validation (status documented, content type, schema) on every GET route and on streamed POSTs."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")


@pytest.fixture(scope="module")
def schema(server):
    return schemathesis.openapi.from_url(f"{server.url}/openapi.json", headers=server.headers)


def _operation(schema, method: str, path: str):
    return schema[path][method].ok() if hasattr(schema[path][method], "ok") else schema[path][method]


@pytest.mark.parametrize("path", ["/health", "/ping", "/metrics", "/v1/models", "/ready", "/version"])
@pytest.mark.parametrize("auth", [True, False], ids=["key", "no-key"])
def test_get_routes_answer_as_documented(server, schema, path, auth):
    case = _operation(schema, "GET", path).Case()
    response = case.call(headers=server.headers if auth else {}, timeout=30)
    assert response.status_code in ((200,) if auth or path in ("/health", "/ping") else (401,))
    case.validate_response(response)


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 3, "stream": True}),
        (
            "/v1/chat/completions",
            {
                "model": "tiny",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 3,
                "stream": True,
            },
        ),
        ("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 3}),
    ],
    ids=["completions-stream", "chat-stream", "completions-json"],
)
def test_streamed_and_plain_answers_are_documented(server, schema, path, body):
    case = _operation(schema, "POST", path).Case(body=body, media_type="application/json")
    response = case.call(headers=server.headers, timeout=60)
    assert response.status_code == 200
    case.validate_response(response)


def test_documented_shapes(server):
    import httpx

    doc = httpx.get(f"{server.url}/openapi.json", headers=server.headers).json()["paths"]
    for probe in ("/health", "/ping"):
        assert doc[probe]["get"]["responses"]["200"]["content"] == {}
        assert "ErrorResponse" in str(doc[probe]["get"]["responses"]["503"])
    assert "text/plain" in doc["/metrics"]["get"]["responses"]["200"]["content"]
    for route in ("/v1/completions", "/v1/chat/completions", "/v1/responses"):
        assert "text/event-stream" in doc[route]["post"]["responses"]["200"]["content"]
