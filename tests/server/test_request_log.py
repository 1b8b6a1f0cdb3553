"""vLLM's --enable-log-requests: the front end logs one INFO line when a request arrives (its id,
params and prompt length; vllm/entrypoints/logger.py logs "Received request <id>: params: ...") and
one when it ends; off by default and with --disable-log-requests, as in vLLM."""

from __future__ import annotations

import logging

import pytest
from server.inproc_app import inproc_app

from fdcli_engine.entrypoints.openai.serving_options import ServingOptions


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "fd.serve" and "request" in r.getMessage()]


def _complete(model, caplog, **flags) -> list[str]:
    caplog.set_level(logging.INFO, logger="fd.serve")
    with inproc_app(model, ServingOptions(), **flags) as (_, http):
        name = http.get("/v1/models").json()["data"][0]["id"]
        r = http.post(
            "/v1/completions",
            json={"model": name, "prompt": [5, 6, 7], "max_tokens": 3, "temperature": 0, "ignore_eos": True},
        )
        assert r.status_code == 200, r.text
    return _lines(caplog)


def test_enable_log_requests_logs_arrival_and_end(tiny_model, caplog):
    lines = _complete(tiny_model, caplog, enable_log_requests=True)
    received = [line for line in lines if line.startswith("Received request")]
    finished = [line for line in lines if line.startswith("Finished request")]
    assert len(received) == len(finished) == 1, lines
    assert "num_prompt_tokens: 3" in received[0] and "max_tokens=3" in received[0]
    assert "finish_reason: length, num_output_tokens: 3" in finished[0]
    rid = received[0].split()[2].rstrip(":")
    assert rid.startswith("cmpl-") and finished[0].split()[2].rstrip(":") == rid


@pytest.mark.parametrize("flags", [{}, {"enable_log_requests": True, "disable_log_requests": True}])
def test_requests_are_not_logged_by_default_or_when_disabled(tiny_model, caplog, flags):
    assert _complete(tiny_model, caplog, **flags) == []
