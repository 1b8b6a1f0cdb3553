"""vLLM's `use_beam_search` through the official openai SDK against the shared tiny-model server: the
choices are the offline LLM.beam_search's beams of the same checkpoint (tests/engine/test_beam_search.py
holds that one to transformers), streamed or not, on completions and chat; fields beam search cannot
honour are a 400 naming them. With logprobs, each token's logprob is transformers' teacher-forced
log-probability of it after the beam's prefix, its alternatives that position's most likely tokens."""

from __future__ import annotations

import openai
import pytest
from tiny_models import load_hf_model

from fdcli_engine.beam_search import BeamSearchParams


@pytest.fixture(scope="module")
def offline(tiny_model):
    from fdcli_engine import LLM

    return LLM(str(tiny_model))


@pytest.fixture(scope="module")
def hf(tiny_model):
    return load_hf_model(tiny_model)


def _beams(llm, prompt_ids, **kw) -> list[list[int]]:
    return [s.tokens[len(prompt_ids) :] for s in _sequences(llm, prompt_ids, **kw)]


def _sequences(llm, prompt_ids, **kw):
    [out] = llm.beam_search([{"prompt_token_ids": prompt_ids}], BeamSearchParams(**kw))
    return out.sequences


def _hf_steps(hf, prompt: list[int], generated: list[int]):
    """transformers' next-token log-probabilities at each generated position, teacher-forced."""
    import torch

    with torch.no_grad():
        logp = torch.log_softmax(hf(torch.tensor([prompt + generated])).logits[0].double(), -1)
    return logp[len(prompt) - 1 : len(prompt) - 1 + len(generated)]


def _tid(text: str) -> int:
    assert text.startswith("token_id:"), text
    return int(text.removeprefix("token_id:"))


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


# Beams of fixed length, their tokens as ids (logprob entries "token_id:N", ids exactly).
AS_IDS = {
    "use_beam_search": True,
    "ignore_eos": True,
    "return_token_ids": True,
    "return_tokens_as_token_ids": True,
}


@pytest.mark.parametrize("num", [1, 5])
def test_completion_logprobs_are_each_beams_own(server, offline, hf, num):
    """logprobs=num (5: more than the 2 x n a step weighs) on each beam: its tokens' logprobs are
    transformers' after the beam's prefix and add up to the beam's cumulative logprob; each
    position's top_logprobs hold the token and the `num` most likely; a stream carries the same."""
    prompt = "the quick brown fox"
    kw = {"model": "tiny", "prompt": prompt, "n": 2, "max_tokens": 4, "logprobs": num}
    client = server.client()
    r = client.completions.create(**kw, extra_body=AS_IDS)
    prompt_ids = offline.tokenizer.encode(prompt)
    seqs = _sequences(offline, prompt_ids, beam_width=2, max_tokens=4, ignore_eos=True)
    assert [c.model_extra["token_ids"] for c in r.choices] == [s.tokens[len(prompt_ids) :] for s in seqs]
    for choice, seq in zip(r.choices, seqs):
        gen, lps = choice.model_extra["token_ids"], choice.logprobs
        assert [_tid(t) for t in lps.tokens] == gen
        for token, logprob, tops, row in zip(
            gen, lps.token_logprobs, lps.top_logprobs, _hf_steps(hf, prompt_ids, gen)
        ):
            assert logprob == pytest.approx(float(row[token]), abs=2e-3)
            assert {_tid(t) for t in tops} == {token, *row.topk(num).indices.tolist()}
            assert all(v == pytest.approx(float(row[_tid(t)]), abs=2e-3) for t, v in tops.items())
        assert sum(lps.token_logprobs) == pytest.approx(seq.cum_logprob, abs=2e-3)
    streamed = {}
    for chunk in client.completions.create(**kw, extra_body=AS_IDS, stream=True):
        for c in chunk.choices:
            if c.logprobs is not None:
                streamed.setdefault(c.index, []).extend(c.logprobs.token_logprobs)
    assert streamed == {c.index: c.logprobs.token_logprobs for c in r.choices}


def test_chat_logprobs_are_each_beams_own(server, hf):
    """logprobs + top_logprobs=3: each token's logprob is transformers' after the beam's prefix, its
    alternatives the 3 most likely, best first; a stream carries the same."""
    kw = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hello"}],
        "n": 2,
        "max_tokens": 4,
        "logprobs": True,
        "top_logprobs": 3,
        "extra_body": AS_IDS,
    }
    client = server.client()
    r = client.chat.completions.create(**kw)
    prompt_ids = r.model_extra["prompt_token_ids"]
    for choice in r.choices:
        gen = choice.model_extra["token_ids"]
        content = choice.logprobs.content
        assert [_tid(c.token) for c in content] == gen
        for token, c, row in zip(gen, content, _hf_steps(hf, prompt_ids, gen)):
            assert c.logprob == pytest.approx(float(row[token]), abs=2e-3)
            assert [_tid(t.token) for t in c.top_logprobs] == row.topk(3).indices.tolist()
    streamed = {}
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            if c.logprobs is not None:
                streamed.setdefault(c.index, []).extend(t.logprob for t in c.logprobs.content)
    assert streamed == {c.index: [t.logprob for t in c.logprobs.content] for c in r.choices}


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"stop": ["x"]}, "stop"),
        ({"extra_body": {"prompt_logprobs": 1}}, "prompt_logprobs"),
        ({"echo": True, "logprobs": 1}, "echo"),
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
