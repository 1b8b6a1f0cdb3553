"""The structured-outputs flags and request forms through a real `fd serve` (tiny random Llama): the
flag reaches the serving layer through EngineConfig and ResolvedConfig; a constrained request on the
default backend matches its constraint; a bad one is a 400 and the server answers after."""

from __future__ import annotations

import re

import openai
import pytest
from fd_server import start_server


def test_constraints_hold_on_a_tiny_random_model(server):
    client = server.client()
    r = client.completions.create(
        model="tiny",
        prompt="the quick",
        max_tokens=8,
        temperature=1.0,
        seed=5,
        extra_body={"guided_regex": "[ab]{2,5}"},
    )
    assert re.fullmatch("[ab]{2,5}", r.choices[0].text), r.choices[0].text
    r = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "pick"}],
        max_tokens=8,
        temperature=1.0,
        seed=5,
        extra_body={"guided_choice": ["left", "right"]},
    )
    assert r.choices[0].message.content in ("left", "right")
    m = server.metrics()  # the engine core compiled both: its counters reach /metrics
    assert m["fd:grammar_compiles_total"] + m["fd:grammar_cache_hits_total"] >= 2
    assert m["fd:grammar_compile_seconds_total"] > 0
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(
            model="tiny", prompt="x", max_tokens=2, extra_body={"guided_grammar": "start: foo"}
        )
    assert e.value.body["param"] == "guided_grammar"
    assert client.completions.create(model="tiny", prompt="x", max_tokens=2).choices[0].finish_reason in (
        "length",
        "stop",
    )


@pytest.fixture(scope="module")
def off_server(tiny_model, tmp_path_factory):
    srv = start_server(
        tiny_model,
        tmp_path_factory.mktemp("srv-off"),
        "--served-model-name",
        "tiny",
        "--structured-outputs-config",
        '{"backend": "off"}',
    )
    yield srv
    srv.stop()


def test_backend_off_from_vllms_flag_refuses_constraints(off_server):
    client = off_server.client()
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "x"}],
            max_tokens=2,
            response_format={"type": "json_object"},
        )
    assert (
        e.value.body["param"] == "response_format"
        and "--guided-decoding-backend off" in e.value.body["message"]
    )
    assert client.completions.create(model="tiny", prompt="x", max_tokens=2).choices[0].finish_reason in (
        "length",
        "stop",
    )
