"""benchmarks/stream_client.py, the serving benchmarks' light HTTP client: against a real `fd serve` it
counts what the official SDK counts, and it rejects every stream that is not complete and error-free."""

from __future__ import annotations

import subprocess
import sys

import pytest
from fd_server import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from stream_client import StreamError, _check_events, run, stream_completion, wait_ready  # noqa: E402


def _body(**kw) -> dict:
    return {"model": "tiny", "prompt": [5, 6, 7, 8], "max_tokens": 9, "ignore_eos": True, "stream": True,
            "return_token_ids": True, "temperature": 0} | kw  # fmt: skip


def test_counts_the_tokens_the_sdk_streams(server):
    n = run(
        stream_completion(server.url, "/v1/completions", _body(), expected_tokens=9, headers=server.headers)
    )
    assert n == 9
    sdk_args = {k: v for k, v in _body().items() if k not in ("ignore_eos", "return_token_ids")}
    sdk = server.client().completions.create(
        **sdk_args, extra_body={"ignore_eos": True, "return_token_ids": True}
    )
    assert sum(len(c.choices[0].token_ids or []) for c in sdk) == n


def test_rejects_wrong_count_error_status_and_missing_auth(server):
    post = lambda body, **kw: run(stream_completion(server.url, "/v1/completions", body, **kw))  # noqa: E731
    with pytest.raises(StreamError, match="streamed 9 tokens, expected 10"):
        post(_body(), expected_tokens=10, headers=server.headers)
    with pytest.raises(StreamError, match="answered 400"):
        post(_body(max_tokens=-1), headers=server.headers)
    with pytest.raises(StreamError, match="answered 401"):
        post(_body())


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b'data: {"choices":[{"token_ids":[1],"finish_reason":"length"}]}\n\n', "does not end with"),
        (b'data: {"choices":[{"token_ids":[1]}]}\n\ndata: [DONE]\n\n', "no chunk carried a finish_reason"),
        (b'data: {"error":{"message":"boom"}}\n\ndata: [DONE]\n\n', "error event"),
        (b'data: {"choices":[{"token_ids":[1],"finish_reason":"length"}]}\n\ndata: [DO', "mid-event"),
        (b"event: x\n\ndata: [DONE]\n\n", "unexpected event"),
    ],
)
def test_malformed_streams_fail(body, match):
    with pytest.raises(StreamError, match=match):
        _check_events(body, None)


def test_well_formed_stream_counts_every_choice():
    body = (
        b'data: {"choices":[{"token_ids":[1,2]}]}\n\n'
        b'data: {"choices":[{"token_ids":[3],"finish_reason":"length"}]}\n\n'
        b"data: [DONE]\n\n"
    )
    assert _check_events(body, 3) == 3


def test_wait_ready_polls_the_given_path(server):
    """bench_vs_llamacpp.py waits on /v1/models for llama.cpp (no /ready there): the path is honoured, and a
    path that never answers 200 (here 401: no API key) ends in SystemExit with the process killed."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        wait_ready(proc, server.url, "the test server", 5, "/health")
        assert proc.poll() is None
        with pytest.raises(SystemExit, match="did not become ready"):
            wait_ready(proc, server.url, "the test server", 1, "/v1/models")
        assert proc.wait(5) != 0
    finally:
        proc.kill()
