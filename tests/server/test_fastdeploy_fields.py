"""FastDeploy's request and response fields, as FastDeploy clients send and read them through the
openai SDK (extra_body / model_extra): return_token_ids' prompt_token_ids, completion_token_ids,
prompt_tokens and completion_tokens (chat message and delta, completion choice), completions'
prompt_token_ids, and the logprob post-processing flags fd cannot honour. FastDeploy's reference:
fastdeploy/entrypoints/openai/{protocol,serving_chat,serving_completion}.py. Scripted engine."""

from __future__ import annotations

import openai
import pytest
from scripted import scripted_client

PIECES = ["<think>", "hm", "</think>", "a", "b"]
MSG = [{"role": "user", "content": "hi there"}]


def _prompt_text(tokenizer, ids):
    return tokenizer.decode(ids, skip_special_tokens=False)


def test_chat_return_token_ids_fastdeploy_fields(tokenizer):
    client, _, engine = scripted_client(tokenizer, PIECES, reasoning_parser="deepseek_r1")
    r = client.chat.completions.create(model="fake", messages=MSG, extra_body={"return_token_ids": True})
    prompt_ids = engine.calls[-1].prompt_token_ids
    msg = r.choices[0].message.model_extra
    assert msg["prompt_token_ids"] == prompt_ids
    assert msg["completion_token_ids"] == [3, 4, 5, 6, 7]
    # prompt_tokens: the rendered chat the model read; completion_tokens: its raw, unparsed output.
    assert msg["prompt_tokens"] == _prompt_text(tokenizer, prompt_ids)
    assert "<|im_start|>user\nhi there" in msg["prompt_tokens"]
    assert msg["completion_tokens"] == "".join(PIECES)
    assert r.choices[0].message.content == "ab"
    # vLLM's fields stay.
    assert r.model_extra["prompt_token_ids"] == prompt_ids and r.choices[0].model_extra["token_ids"] == [
        3,
        4,
        5,
        6,
        7,
    ]
    plain = client.chat.completions.create(model="fake", messages=MSG)
    assert plain.choices[0].message.model_extra.get("prompt_token_ids") is None
    assert plain.choices[0].message.model_extra.get("completion_tokens") is None


def test_chat_stream_return_token_ids_fastdeploy_fields(tokenizer):
    client, _, engine = scripted_client(tokenizer, PIECES, reasoning_parser="deepseek_r1")
    chunks = list(
        client.chat.completions.create(
            model="fake", messages=MSG, stream=True, extra_body={"return_token_ids": True}
        )
    )
    prompt_ids = engine.calls[-1].prompt_token_ids
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant"
    assert deltas[0].model_extra["prompt_token_ids"] == prompt_ids
    assert deltas[0].model_extra["prompt_tokens"] == _prompt_text(tokenizer, prompt_ids)
    later = [d.model_extra for d in deltas[1:]]
    assert all("prompt_token_ids" not in d for d in later)
    # Every generated id once, in order, with its raw text (the think tags included).
    assert [t for d in later for t in d.get("completion_token_ids", [])] == [3, 4, 5, 6, 7]
    assert "".join(d.get("completion_tokens", "") for d in later) == "".join(PIECES)


def test_completions_return_token_ids_fastdeploy_fields(tokenizer):
    client, _, engine = scripted_client(tokenizer, ["a", "b"])
    r = client.completions.create(model="fake", prompt="hello", extra_body={"return_token_ids": True})
    prompt_ids = engine.calls[-1].prompt_token_ids
    c = r.choices[0].model_extra
    assert c["prompt_token_ids"] == prompt_ids and c["token_ids"] == [3, 4]
    assert c["completion_token_ids"] == [3, 4]
    assert c["prompt_tokens"] == "hello" and c["completion_tokens"] == "ab"
    echoed = client.completions.create(
        model="fake", prompt="hello", echo=True, extra_body={"return_token_ids": True}
    ).choices[0]
    assert echoed.text == "helloab" and echoed.model_extra["completion_tokens"] == "ab"

    stream = client.completions.create(
        model="fake", prompt="hello", stream=True, extra_body={"return_token_ids": True}
    )
    choices = [ch.choices[0].model_extra for ch in stream if ch.choices]
    assert choices[0]["prompt_token_ids"] == prompt_ids and choices[0]["prompt_tokens"] == "hello"
    assert all("prompt_token_ids" not in c for c in choices[1:])
    assert [t for c in choices for t in c["completion_token_ids"]] == [3, 4]
    assert [c["completion_token_ids"] for c in choices] == [c["token_ids"] for c in choices]
    assert "".join(c["completion_tokens"] for c in choices) == "ab"


def test_completions_prompt_token_ids_replace_the_prompt(tokenizer):
    client, _, engine = scripted_client(tokenizer, ["a"])
    r = client.completions.create(
        model="fake", prompt="ignored", extra_body={"prompt_token_ids": [5, 6, 7], "return_token_ids": True}
    )
    assert engine.calls[-1].prompt_token_ids == [5, 6, 7] and r.usage.prompt_tokens == 3
    assert r.choices[0].model_extra["prompt_tokens"] == _prompt_text(tokenizer, [5, 6, 7])
    r = client.completions.create(model="fake", prompt="x", extra_body={"prompt_token_ids": [[5, 6], [7]]})
    assert sorted(c.prompt_token_ids for c in engine.calls[-2:]) == [[5, 6], [7]]
    assert len(r.choices) == 2 and r.usage.prompt_tokens == 3
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="fake", prompt="x", extra_body={"prompt_token_ids": []})
    assert e.value.status_code == 400


@pytest.mark.parametrize(
    "field,sampling",
    [("temp_scaled_logprobs", {"temperature": 0.5}), ("top_p_normalized_logprobs", {"top_p": 0.9})],
)
def test_logprob_post_processing_is_refused_where_it_would_change_them(tokenizer, field, sampling):
    client, http, _ = scripted_client(tokenizer, ["a"])
    for api in ("chat", "completions"):
        args = dict(messages=MSG, logprobs=True) if api == "chat" else dict(prompt="hi", logprobs=1)
        resource = client.chat.completions if api == "chat" else client.completions
        create, raw = resource.create, resource.with_raw_response.create
        with pytest.raises(openai.BadRequestError) as e:
            create(model="fake", **args, **sampling, extra_body={field: True})
        assert e.value.body["param"] == field and "raw" in e.value.body["message"], api
        # At temperature 1 / top_p 1 the raw logprobs are the asked ones; without logprobs nothing
        # is asked: both answered, and the field is known (not in fd-ignored-fields).
        r = raw(model="fake", **args, extra_body={field: True})
        assert r.status_code == 200 and "fd-ignored-fields" not in r.headers, api
        r = raw(
            model="fake",
            **{k: v for k, v in args.items() if k != "logprobs"},
            **sampling,
            extra_body={field: True},
        )
        assert r.status_code == 200, api


def test_fastdeploy_fields_that_cannot_apply_are_accepted_quietly(tokenizer):
    client, _, _ = scripted_client(tokenizer, ["a"])
    extra = {
        "include_draft_logprobs": True,
        "include_logprobs_decode_token": False,
        "logits_processors_args": {"k": 1},
        "mm_hashes": ["h"],
        "trace_context": "t",
        "collect_metrics": True,
        "disaggregate_info": {},
    }
    r = client.chat.completions.with_raw_response.create(model="fake", messages=MSG, extra_body=extra)
    assert r.status_code == 200 and "fd-ignored-fields" not in r.headers
    r = client.completions.with_raw_response.create(model="fake", prompt="hi", extra_body=extra)
    assert r.status_code == 200 and "fd-ignored-fields" not in r.headers


def test_chat_completion_token_ids_resume_the_answer(tokenizer):
    """FastDeploy appends a request's completion_token_ids to the prompt's ids (its data processors'
    `prompt_token_ids.extend(completion_token_ids)`): the model continues that answer."""
    client, _, engine = scripted_client(tokenizer, ["a"])
    client.chat.completions.create(model="fake", messages=MSG)
    rendered = engine.calls[-1].prompt_token_ids
    r = client.chat.completions.create(
        model="fake", messages=MSG, extra_body={"completion_token_ids": [9, 10], "return_token_ids": True}
    )
    assert engine.calls[-1].prompt_token_ids == rendered + [9, 10]
    assert r.usage.prompt_tokens == len(rendered) + 2
    assert r.choices[0].message.model_extra["prompt_tokens"] == _prompt_text(tokenizer, rendered + [9, 10])
    client.chat.completions.create(
        model="fake", messages=[], extra_body={"prompt_token_ids": [5, 6], "completion_token_ids": [7]}
    )
    assert engine.calls[-1].prompt_token_ids == [5, 6, 7]


THINK_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
)


def test_chat_metadata_enable_thinking_and_streaming_tokens(tokenizer):
    """FastDeploy's docs send `"metadata": {"enable_thinking": false}`; its serving reads
    chat_template_kwargs first, then metadata (and metadata.max_streaming_response_tokens)."""
    client, _, engine = scripted_client(tokenizer, ["a", "b", "c", "d", "e"], chat_template=THINK_TEMPLATE)

    def prompt(**extra):
        client.chat.completions.create(model="fake", messages=MSG, extra_body=extra)
        return engine.calls[-1].prompt

    assert "</think>" not in prompt()
    assert prompt(metadata={"enable_thinking": False}).endswith("<think>\n\n</think>\n\n")
    assert prompt(metadata={"enable_thinking": "false"}).endswith("</think>\n\n")  # OpenAI's string values
    assert "</think>" not in prompt(metadata={"enable_thinking": True})
    off, on = {"enable_thinking": False}, {"enable_thinking": True}
    assert "</think>" not in prompt(metadata=off, chat_template_kwargs=on)  # the request's own field wins
    assert "</think>" not in prompt(metadata={"topic": "x"})  # other keys: OpenAI's tags
    with pytest.raises(openai.BadRequestError) as e:
        prompt(metadata={"enable_thinking": "maybe"})
    assert e.value.body["param"] == "metadata.enable_thinking"

    def texts(**extra):
        stream = client.chat.completions.create(model="fake", messages=MSG, stream=True, extra_body=extra)
        return [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]

    assert texts(metadata={"max_streaming_response_tokens": 2}) == ["a", "bc", "de"]
    assert texts(metadata={"max_streaming_response_tokens": "4"}) == ["a", "bcde"]
    assert texts(metadata={"max_streaming_response_tokens": 4}, max_streaming_response_tokens=2) == [
        "a",
        "bc",
        "de",
    ]
    with pytest.raises(openai.BadRequestError) as e:
        texts(metadata={"max_streaming_response_tokens": 0})
    assert e.value.body["param"] == "metadata.max_streaming_response_tokens"


def test_completions_suffix_object_is_fastdeploys_option_channel(tokenizer):
    """FastDeploy's completions read suffix.max_streaming_response_tokens (an object suffix); OpenAI's
    text suffix stays refused."""
    client, _, _ = scripted_client(tokenizer, ["a", "b", "c", "d", "e"])

    def texts(**extra):
        stream = client.completions.create(model="fake", prompt="hi", stream=True, extra_body=extra)
        return [c.choices[0].text for c in stream if c.choices]

    assert texts(suffix={"max_streaming_response_tokens": 2}) == ["a", "bc", "de"]
    assert texts(suffix={"max_streaming_response_tokens": 4}, max_streaming_response_tokens=2) == [
        "a",
        "bc",
        "de",
    ]
    for suffix, param in (({"top_k": 3}, "suffix.top_k"), ("tail", "suffix")):
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model="fake", prompt="hi", extra_body={"suffix": suffix})
        assert e.value.body["param"] == param
