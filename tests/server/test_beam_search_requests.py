"""vLLM's `use_beam_search` through the official openai SDK against the shared tiny-model server: the
choices are the offline LLM.beam_search's beams of the same checkpoint (tests/engine/test_beam_search.py
holds that one to transformers), streamed or not, on completions and chat; fields beam search cannot
honour are a 400 naming them."""

from __future__ import annotations

import openai
import pytest

from fdcli_engine.beam_search import BeamSearchParams


@pytest.fixture(scope="module")
def offline(tiny_model):
    from fdcli_engine import LLM

    return LLM(str(tiny_model))


def _beams(llm, prompt_ids, **kw) -> list[list[int]]:
    [out] = llm.beam_search([{"prompt_token_ids": prompt_ids}], BeamSearchParams(**kw))
    return [s.tokens[len(prompt_ids) :] for s in out.sequences]


def test_completion_choices_are_the_beams(server, offline):
    prompt = "the quick brown fox"
    body = {"use_beam_search": True, "ignore_eos": True, "return_token_ids": True}
    r = server.client().completions.create(model="tiny", prompt=prompt, n=3, max_tokens=5, extra_body=body)
    want = _beams(offline, offline.tokenizer.encode(prompt), beam_width=3, max_tokens=5, ignore_eos=True)
    assert [c.model_extra["token_ids"] for c in r.choices] == want
    assert [c.index for c in r.choices] == [0, 1, 2] and {c.finish_reason for c in r.choices} == {"length"}
    assert r.usage.completion_tokens == 15


def test_a_stream_carries_each_beam_whole(server):
    client = server.client()
    kw = {"model": "tiny", "prompt": "hello world", "n": 2, "max_tokens": 4}
    body = {"use_beam_search": True, "ignore_eos": True}
    full = client.completions.create(**kw, extra_body=body)
    texts = {0: "", 1: ""}
    for chunk in client.completions.create(**kw, extra_body=body, stream=True):
        for c in chunk.choices:
            texts[c.index] += c.text
    assert texts == {c.index: c.text for c in full.choices}


def test_chat_choices_are_the_beams_of_the_rendered_prompt(server, offline):
    messages = [{"role": "user", "content": "hello"}]
    r = server.client().chat.completions.create(
        model="tiny",
        messages=messages,
        n=2,
        max_tokens=4,
        extra_body={"use_beam_search": True, "ignore_eos": True, "return_token_ids": True},
    )
    prompt_ids = r.model_extra["prompt_token_ids"]
    assert [c.model_extra["token_ids"] for c in r.choices] == _beams(
        offline, prompt_ids, beam_width=2, max_tokens=4, ignore_eos=True
    )


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"stop": ["x"]}, "stop"),
        ({"logprobs": 2}, "logprobs"),
        ({"extra_body": {"guided_regex": "[a-z]+"}}, "guided_regex"),
        ({"n": 11}, "n"),
    ],
)
def test_fields_beam_search_cannot_honour_are_refused(server, extra, param):
    body = {"use_beam_search": True, **extra.pop("extra_body", {})}
    kw = {"model": "tiny", "prompt": "hello", "max_tokens": 3, "n": 2, **extra}
    with pytest.raises(openai.BadRequestError) as e:
        server.client().completions.create(**kw, extra_body=body)
    assert e.value.status_code == 400 and e.value.body["param"] == param
