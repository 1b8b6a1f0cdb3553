"""The reasoning budget through the official openai SDK (extra_body), on `fd serve`'s app over the tiny
model in process with --reasoning-parser deepseek_r1 and a template that opens the block: FastDeploy's
reasoning_max_tokens and vLLM's thinking_token_budget close the reasoning after exactly N tokens,
FastDeploy's response_max_tokens bounds the answer, usage reports the reasoning tokens as vLLM does
(completion_tokens_details.reasoning_tokens), and a bad value is OpenAI's 400 naming the field."""

from __future__ import annotations

import openai
import pytest
from scripted import scripted_client
from server.inproc_app import inproc_app

from fdcli_engine.entrypoints.openai.serving_options import ServingOptions

THINK_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "<|im_start|>assistant\n<think>\n"
)
MSG = [{"role": "user", "content": "what is the answer?"}]
N = 5


@pytest.fixture(scope="module")
def app(tiny_model):
    serving = ServingOptions(reasoning_parser="deepseek_r1", chat_template=THINK_TEMPLATE)
    with inproc_app(tiny_model, serving, max_model_len=128, block_size=8) as (client, _):
        yield client


@pytest.fixture(scope="module")
def end_ids(tokenizer_of_tiny):
    return tokenizer_of_tiny.encode("</think>", add_special_tokens=False)


@pytest.fixture(scope="module")
def tokenizer_of_tiny(tiny_model):
    from fdcli_engine.tokenizer import Tokenizer

    return Tokenizer.from_model(tiny_model)


def _create(client, stream=False, **extra):
    body = {"ignore_eos": True, "return_token_ids": True, **extra}
    return client.chat.completions.create(
        model=client.models.list().data[0].id,
        messages=MSG,
        temperature=0,
        max_tokens=24,
        stream=stream,
        stream_options={"include_usage": True} if stream else None,
        extra_body=body,
    )


def test_budget_closes_the_reasoning_after_exactly_n_tokens(app, end_ids, tokenizer_of_tiny):
    free = _create(app).choices[0].token_ids
    assert free[: len(end_ids)] != end_ids
    for field in ("reasoning_max_tokens", "thinking_token_budget"):
        r = _create(app, **{field: N})
        choice = r.choices[0]
        ids = choice.token_ids
        assert ids[:N] == free[:N] and ids[N : N + len(end_ids)] == end_ids, field
        assert len(ids) == 24 and choice.finish_reason == "length"
        # The tiny model's vocabulary outgrows its tokenizer's: such ids decode to no text.
        decode = tokenizer_of_tiny.backend.decode
        assert choice.message.reasoning_content == decode(free[:N])
        after = decode(ids[N + len(end_ids) :])
        assert choice.message.content == after.lstrip("\n")
        assert r.usage.completion_tokens_details.reasoning_tokens == N
    # Without a budget the model never closes the block here: every token is reasoning.
    assert _create(app).usage.completion_tokens_details.reasoning_tokens == 24


def test_streamed_budget_matches_and_reports_reasoning_tokens(app, end_ids):
    whole = _create(app, thinking_token_budget=N).choices[0].token_ids
    chunks = list(_create(app, stream=True, thinking_token_budget=N))
    streamed = [t for c in chunks if c.choices for t in (getattr(c.choices[0], "token_ids", None) or [])]
    assert streamed == whole
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == N


def test_response_max_tokens_bounds_the_answer(app, end_ids):
    choice = _create(app, reasoning_max_tokens=3, response_max_tokens=4).choices[0]
    assert choice.token_ids[3 : 3 + len(end_ids)] == end_ids
    assert len(choice.token_ids) == 3 + len(end_ids) + 4 and choice.finish_reason == "length"


@pytest.mark.parametrize(
    "field,value",
    [
        ("reasoning_max_tokens", -1),
        ("reasoning_max_tokens", 0),  # FastDeploy's bound: at least 1
        ("reasoning_max_tokens", "8"),
        ("reasoning_max_tokens", 2.5),
        ("thinking_token_budget", -2),  # vLLM's: 0 or more, -1 for none
        ("thinking_token_budget", True),
        ("response_max_tokens", 0),
        ("response_max_tokens", "x"),
    ],
)
def test_bad_values_are_a_400_naming_the_field(app, field, value):
    with pytest.raises(openai.BadRequestError) as e:
        _create(app, **{field: value})
    assert e.value.status_code == 400 and e.value.body["param"] == field


def test_two_names_for_one_budget_must_agree(app):
    with pytest.raises(openai.BadRequestError) as e:
        _create(app, reasoning_max_tokens=3, thinking_token_budget=4)
    assert e.value.body["param"] == "thinking_token_budget"
    assert _create(app, reasoning_max_tokens=3, thinking_token_budget=3).usage.completion_tokens_details


def test_a_budget_needs_a_reasoning_parser(tokenizer):
    """vLLM's 400 ("thinking_token_budget is set but reasoning_config is not configured"); the answer's
    own cap needs no parser: with no reasoning block the whole output is the answer."""
    client, _, engine = scripted_client(tokenizer, ["a"])
    for field in ("reasoning_max_tokens", "thinking_token_budget"):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="fake", messages=MSG, extra_body={field: 4})
        assert e.value.body["param"] == field and "--reasoning-parser" in e.value.body["message"]
    r = client.chat.completions.create(
        model="fake", messages=MSG, extra_body={"thinking_token_budget": -1, "response_max_tokens": 4}
    )
    assert r.usage.completion_tokens_details is None  # no parser, no reasoning count
    params = engine.calls[-1].params
    assert params.response_max_tokens == 4 and params.reasoning_markers is None
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="fake", messages=MSG, n=2, extra_body={"use_beam_search": True, "response_max_tokens": 4}
        )
    assert e.value.body["param"] == "response_max_tokens"


def test_responses_usage_counts_reasoning_tokens(app):
    """The Responses API's usage.output_tokens_details.reasoning_tokens, by the same count: here the
    model never closes the block the template opened, so every output token is reasoning."""
    for stream in (False, True):
        r = app.responses.create(
            model=app.models.list().data[0].id, input="hi", max_output_tokens=6, temperature=0, stream=stream
        )
        if stream:
            r = [e for e in r if e.type in ("response.completed", "response.incomplete")][0].response
        assert r.usage.output_tokens == 6
        assert r.usage.output_tokens_details.reasoning_tokens == 6


def test_completions_take_vllms_budget(app, end_ids, tokenizer):
    """vLLM's thinking_token_budget on /v1/completions too: the prompt opens the block here."""
    model = app.models.list().data[0].id
    body = {"ignore_eos": True, "return_token_ids": True}
    prompt = "what is the answer?\n<think>\n"
    free = app.completions.create(model=model, prompt=prompt, max_tokens=16, temperature=0, extra_body=body)
    r = app.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=16,
        temperature=0,
        extra_body={**body, "thinking_token_budget": 3},
    )
    ids = r.choices[0].token_ids
    assert ids[:3] == free.choices[0].token_ids[:3] and ids[3 : 3 + len(end_ids)] == end_ids
    client, _, _ = scripted_client(tokenizer, ["a"])
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="fake", prompt="p", extra_body={"thinking_token_budget": 3})
    assert e.value.body["param"] == "thinking_token_budget"
