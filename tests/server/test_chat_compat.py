"""Chat and completions behaviours drop-in clients rely on: the role chunk after prefill, FastDeploy's
max_streaming_response_tokens / disable_chat_template / prompt_token_ids, vLLM's
continue_final_message and continuous_usage_stats, exactly k top_logprobs, and OpenAI's
context_length_exceeded error. In-process over a scripted engine unless a model is needed."""

from __future__ import annotations

import asyncio
import json
import math

import openai
import pytest
from scripted import ScriptedEngine, scripted_client

from fdcli_engine.entrypoints.openai.protocol import ChatCompletionRequest
from fdcli_engine.entrypoints.openai.serving_chat import OpenAIServingChat

PIECES = ["a", "b", "c", "d", "e"]
MSG = [{"role": "user", "content": "hi there"}]


def _events(chunks: list[str]) -> list[dict]:
    assert chunks[-1] == "data: [DONE]\n\n"
    return [json.loads(c[6:]) for c in chunks[:-1]]


def test_role_chunk_waits_for_the_first_output(tokenizer):
    engine = ScriptedEngine(tokenizer, PIECES)
    chat = OpenAIServingChat(engine, ["fake"])
    req = ChatCompletionRequest(messages=MSG, stream=True, n=2)

    async def first_chunks():
        seen = []
        stream = await chat.create_chat_completion(req)
        async for chunk in stream:
            seen.append((engine.produced, chunk))
        return seen

    seen = asyncio.run(first_chunks())
    roles = [(produced, json.loads(c[6:])) for produced, c in seen if c.startswith("data: {")]
    roles = [(p, e["choices"][0]) for p, e in roles if e["choices"][0]["delta"].get("role")]
    assert sorted(ch["index"] for _, ch in roles) == [0, 1]  # one role chunk per choice
    # No chunk leaves before the engine produced a token; the first chunk is a role chunk.
    assert seen[0][0] >= 1 and json.loads(seen[0][1][6:])["choices"][0]["delta"]["role"] == "assistant"


def test_max_streaming_response_tokens_batches_tokens_per_chunk(tokenizer):
    client, _, _ = scripted_client(tokenizer, PIECES)
    for api in ("chat", "completions"):
        if api == "chat":
            stream = client.chat.completions.create(
                model="fake", messages=MSG, stream=True, extra_body={"max_streaming_response_tokens": 2}
            )
            texts = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
        else:
            stream = client.completions.create(
                model="fake", prompt="hi", stream=True, extra_body={"max_streaming_response_tokens": 2}
            )
            texts = [c.choices[0].text for c in stream if c.choices]
        # The first token alone (time to first token is not held back), then two per chunk.
        assert texts == ["a", "bc", "de"], api


def test_continuous_usage_stats_on_every_chunk(tokenizer):
    client, _, engine = scripted_client(tokenizer, PIECES)
    opts = {"include_usage": True, "continuous_usage_stats": True}
    chat = list(client.chat.completions.create(model="fake", messages=MSG, stream=True, stream_options=opts))
    n_prompt = len(engine.calls[-1].prompt_token_ids)
    assert all(c.usage is not None for c in chat)
    assert [c.usage.completion_tokens for c in chat] == [0, 1, 2, 3, 4, 5, 5]  # role chunk, 5 tokens, final
    assert all(c.usage.prompt_tokens == n_prompt for c in chat)
    assert all(c.usage.total_tokens == n_prompt + c.usage.completion_tokens for c in chat)
    cmpl = list(client.completions.create(model="fake", prompt="hi", stream=True, stream_options=opts))
    n_prompt = len(engine.calls[-1].prompt_token_ids)
    assert [c.usage.completion_tokens for c in cmpl] == [1, 2, 3, 4, 5, 5]
    assert all(c.usage.prompt_tokens == n_prompt for c in cmpl)
    plain = list(client.chat.completions.create(model="fake", messages=MSG, stream=True))
    assert all(c.usage is None for c in plain)


def test_disable_chat_template_and_prompt_token_ids(tokenizer):
    client, _, engine = scripted_client(tokenizer, PIECES)
    messages = [{"role": "user", "content": "the quick brown fox"}, {"role": "user", "content": "later"}]
    client.chat.completions.create(
        model="fake", messages=messages, extra_body={"disable_chat_template": True}
    )
    prompt, ids, _, _ = engine.calls[-1]
    assert prompt == "the quick brown fox" and ids == list(tokenizer.encode("the quick brown fox"))
    r = client.chat.completions.create(model="fake", messages=[], extra_body={"prompt_token_ids": [5, 6, 7]})
    assert engine.calls[-1].prompt_token_ids == [5, 6, 7] and r.usage.prompt_tokens == 3
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="fake", messages=[])
    assert e.value.param == "messages"


def test_truncate_prompt_tokens_keeps_the_last_tokens(tokenizer):
    client, _, engine = scripted_client(tokenizer, PIECES)
    client.completions.create(model="fake", prompt=[5, 6, 7, 8, 9], extra_body={"truncate_prompt_tokens": 2})
    assert engine.calls[-1].prompt_token_ids == [8, 9]
    client.chat.completions.create(model="fake", messages=MSG, extra_body={"truncate_prompt_tokens": 3})
    full = OpenAIServingChat(engine, ["fake"]).render(ChatCompletionRequest(messages=MSG))[1]
    assert engine.calls[-1].prompt_token_ids == full[-3:]


CONTINUE = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is"},
]


def test_continue_final_message_leaves_the_turn_open(tokenizer):
    client, _, engine = scripted_client(tokenizer, PIECES)
    body = {"continue_final_message": True, "add_generation_prompt": False}
    client.chat.completions.create(model="fake", messages=CONTINUE, extra_body=body)
    prompt = engine.calls[-1].prompt
    assert prompt.endswith("<|im_start|>assistant\nThe capital of France is")  # no <|im_end|>, no new turn
    closed = OpenAIServingChat(engine, ["fake"]).render(
        ChatCompletionRequest(messages=CONTINUE, add_generation_prompt=False)
    )[0]
    assert closed.startswith(prompt) and closed != prompt
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="fake", messages=CONTINUE, extra_body={"continue_final_message": True}
        )
    assert "Cannot set both `continue_final_message` and `add_generation_prompt`" in e.value.message


def test_continue_final_message_on_smollm2_template():
    from fdcli_engine.config import default_model_path
    from fdcli_engine.tokenizer import Tokenizer

    try:
        path = default_model_path()
    except Exception as e:  # noqa: BLE001
        pytest.skip(str(e))
    tok = Tokenizer.from_model(path)
    chat = OpenAIServingChat(ScriptedEngine(tok, PIECES), ["smol"])
    req = ChatCompletionRequest(messages=CONTINUE, continue_final_message=True, add_generation_prompt=False)
    text, ids = chat.render(req)
    assert text.endswith("<|im_start|>assistant\nThe capital of France is")
    assert tok.decode(ids, skip_special_tokens=False).endswith("The capital of France is")


def test_context_overflow_is_openais_context_length_exceeded(tokenizer):
    client, _, _ = scripted_client(tokenizer, PIECES)  # max_model_len 256
    long = "the quick brown fox " * 200
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="fake", messages=[{"role": "user", "content": long}])
    err, body = e.value, e.value.body
    assert (err.code, err.param, err.type) == ("context_length_exceeded", "messages", "invalid_request_error")
    assert body["message"].startswith(
        "This model's maximum context length is 256 tokens. However, your messages "
    )
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="fake", prompt="hi", max_tokens=300)
    err, body = e.value, e.value.body
    assert err.code == "context_length_exceeded" and err.param == "max_tokens"
    assert body["message"].startswith(
        "This model's maximum context length is 256 tokens. However, you requested "
    )


def test_chat_top_logprobs_are_exactly_k(server, tiny_model):
    import torch
    from tiny_models import load_hf_model

    client = server.client()
    r = client.chat.completions.create(
        model="tiny",
        messages=MSG,
        max_tokens=24,
        temperature=2.0,
        seed=7,
        logprobs=True,
        top_logprobs=1,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    choice = r.choices[0]
    prompt_ids = r.prompt_token_ids
    model = load_hf_model(tiny_model)
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + choice.token_ids])).logits[0].double()
    logp = torch.log_softmax(logits[len(prompt_ids) - 1 : -1], -1)
    outside = 0
    for k, (entry, tid) in enumerate(zip(choice.logprobs.content, choice.token_ids)):
        assert len(entry.top_logprobs) == 1, k  # exactly k alternatives, never k + 1
        assert entry.top_logprobs[0].logprob == pytest.approx(float(logp[k].max()), abs=2e-3)
        assert entry.logprob == pytest.approx(float(logp[k, tid]), abs=2e-3)  # the sampled token's own
        outside += int(tid) != int(logp[k].argmax())
    assert outside > 0  # the case that used to give k + 1 happened
    r0 = client.chat.completions.create(
        model="tiny",
        messages=MSG,
        max_tokens=4,
        logprobs=True,
        top_logprobs=0,
        extra_body={"ignore_eos": True},
    )
    assert all(e.top_logprobs == [] and not math.isnan(e.logprob) for e in r0.choices[0].logprobs.content)


def test_bad_words_token_ids_ban_tokens(server, tiny_model):
    import torch
    from tiny_models import load_hf_model

    client = server.client()
    args = dict(model="tiny", prompt="the quick brown fox", max_tokens=1, temperature=0)
    first = client.completions.create(**args, extra_body={"return_token_ids": True}).choices[0]
    banned = first.token_ids[0]
    again = client.completions.create(
        **args, extra_body={"return_token_ids": True, "bad_words_token_ids": [banned]}
    ).choices[0]
    model = load_hf_model(tiny_model)
    with torch.no_grad():
        logits = model(torch.tensor([first.prompt_token_ids])).logits[0, -1]
    assert int(logits.argmax()) == banned
    logits[banned] = -math.inf
    assert again.token_ids == [int(logits.argmax())]  # the runner-up, as transformers ranks it
