"""The model's sampling defaults (ModelConfig.default_sampling_params, from --generation-config) reach
every generation route's SamplingParams for the fields a request leaves out, and a field the request
sets always wins. The scripted engine records the params it received."""

from __future__ import annotations

import pytest
from scripted import ModelConfig, scripted_client

DEFAULTS = {
    "temperature": 0.3,
    "top_k": 7,
    "top_p": 0.9,
    "min_p": 0.05,
    "repetition_penalty": 1.2,
    "max_tokens": 4,
}
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture
def served(tokenizer):
    model = ModelConfig("tiny", vocab_size=300, default_sampling_params=dict(DEFAULTS))
    client, _, engine = scripted_client(tokenizer, ["a", "b"], model_config=model)
    return client, engine


def _sampling(params) -> dict:
    return {k: getattr(params, k) for k in DEFAULTS}


def test_chat_without_fields_takes_every_default(served):
    client, engine = served
    client.chat.completions.create(model="tiny", messages=MESSAGES)
    assert _sampling(engine.calls[-1].params) == DEFAULTS


def test_fields_the_request_sets_win(served):
    client, engine = served
    client.chat.completions.create(
        model="tiny", messages=MESSAGES, temperature=1.0, top_p=1.0, max_tokens=9,
        extra_body={"top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0},
    )  # fmt: skip
    explicit = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0}
    assert _sampling(engine.calls[-1].params) == {**explicit, "max_tokens": 9}
    client.chat.completions.create(model="tiny", messages=MESSAGES, max_completion_tokens=2, temperature=0)
    assert engine.calls[-1].params.max_tokens == 2
    assert engine.calls[-1].params.temperature == 0 and engine.calls[-1].params.top_k == 7


def test_default_max_tokens_is_capped_by_the_context(tokenizer):
    model = ModelConfig("tiny", max_model_len=20, vocab_size=300, default_sampling_params={"max_tokens": 500})
    client, _, engine = scripted_client(tokenizer, ["a"], model_config=model)
    client.chat.completions.create(model="tiny", messages=MESSAGES)  # no 400: the default is a cap
    prompt_len = len(engine.calls[-1].prompt_token_ids)
    assert engine.calls[-1].params.max_tokens == 20 - prompt_len


def test_completions_keep_openais_16_unless_max_tokens_is_null(served):
    client, engine = served
    client.completions.create(model="tiny", prompt="hi")
    params = engine.calls[-1].params
    assert params.max_tokens == 16 and params.temperature == 0.3 and params.top_k == 7  # as vLLM
    client.completions.create(model="tiny", prompt="hi", max_tokens=None, extra_body={"max_tokens": None})
    assert engine.calls[-1].params.max_tokens == 4


def test_responses_take_the_defaults(served):
    client, engine = served
    client.responses.create(model="tiny", input="hi")
    assert _sampling(engine.calls[-1].params) == DEFAULTS
    client.responses.create(model="tiny", input="hi", temperature=0.0, max_output_tokens=3)
    assert engine.calls[-1].params.temperature == 0.0 and engine.calls[-1].params.max_tokens == 3


def test_no_defaults_leave_the_engines_own(tokenizer):
    client, _, engine = scripted_client(tokenizer, ["a"], model_config=ModelConfig("tiny", vocab_size=300))
    client.chat.completions.create(model="tiny", messages=MESSAGES)
    params = engine.calls[-1].params
    assert (params.temperature, params.top_k, params.top_p, params.min_p, params.repetition_penalty) == (
        1.0, 0, 1.0, 0.0, 1.0,
    )  # fmt: skip
    assert params.max_tokens == 256 - len(engine.calls[-1].prompt_token_ids)
