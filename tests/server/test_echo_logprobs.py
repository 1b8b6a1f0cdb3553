"""lm-evaluation-harness's loglikelihood request (echo, logprobs 1, max_tokens 1 or 0, a list of prompts),
vLLM's prompt_logprobs field on completions and chat, and logit_bias, through the official openai SDK
against a real `fd serve` (tiny random Llama, fp32 KV cache).

Oracle: transformers' log_softmax of the same checkpoint. Tolerance 5e-5 on the prompt tokens' logprobs
(the engine's fp32 path differs by at most ~5e-6: tests/engine/test_prompt_logprobs.py)."""

from __future__ import annotations

import json

import httpx
import pytest

ATOL = 5e-5
PROMPTS = ["the quick brown fox jumps", "hello world, this is a test of the"]


@pytest.fixture(scope="module")
def ref(tiny_model):
    """token ids -> [len, vocab] log_softmax of transformers' forward."""
    import torch
    from tiny_models import load_hf_model

    model = load_hf_model(tiny_model)

    def log_softmax(ids: list[int]):
        with torch.no_grad():
            return torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1).numpy()

    return log_softmax


def _tokenize(server, text: str) -> list[int]:
    with server.http() as h:
        return h.post("/tokenize", json={"prompt": text}).json()["tokens"]


def _check_prompt_part(lp, ids, ref_lp, n_prompt):
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for pos in range(1, n_prompt):
        assert lp.token_logprobs[pos] == pytest.approx(ref_lp[pos - 1][ids[pos]], abs=ATOL)
        top = lp.top_logprobs[pos]
        assert 1 <= len(top) <= 2  # the prompt token and the top-1 (one entry when they coincide)
        assert max(top.values()) == pytest.approx(ref_lp[pos - 1].max(), abs=ATOL)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]


@pytest.mark.parametrize("max_tokens", [1, 0])
def test_lm_eval_loglikelihood_request(server, ref, max_tokens):
    ids = [_tokenize(server, p) for p in PROMPTS]
    r = server.client().completions.create(
        model="tiny", prompt=PROMPTS, echo=True, logprobs=1, max_tokens=max_tokens, temperature=0
    )
    assert [c.index for c in r.choices] == [0, 1]
    for choice, text, p in zip(r.choices, PROMPTS, ids):
        lp, ref_lp = choice.logprobs, ref(p)
        assert len(lp.tokens) == len(p) + max_tokens
        _check_prompt_part(lp, p, ref_lp, len(p))
        assert choice.text.startswith(text)
        if max_tokens == 0:  # the prompt only
            assert choice.text == text
        else:  # then the greedy token, with its own logprob
            assert lp.token_logprobs[-1] == pytest.approx(ref_lp[-1].max(), abs=ATOL)
            assert choice.text == text + lp.tokens[-1]
        assert "".join(lp.tokens) == choice.text
    assert r.usage.completion_tokens == 2 * max_tokens
    assert r.usage.prompt_tokens == sum(len(p) for p in ids)


def test_token_id_prompts_and_vllm_prompt_logprobs_field(server, ref):
    p = _tokenize(server, PROMPTS[1])
    r = server.client().completions.create(
        model="tiny", prompt=[p], max_tokens=2, temperature=0, extra_body={"prompt_logprobs": 2}
    )
    choice = r.choices[0]
    assert choice.logprobs is None  # no echo: the legacy logprobs were not asked for
    pl = choice.model_extra["prompt_logprobs"]
    ref_lp = ref(p)
    assert len(pl) == len(p) and pl[0] is None
    for pos in range(1, len(p)):
        entry = pl[pos]
        own = entry[str(p[pos])]
        assert own["logprob"] == pytest.approx(ref_lp[pos - 1][p[pos]], abs=ATOL)
        row, value = ref_lp[pos - 1], ref_lp[pos - 1][p[pos]]
        assert 1 + (row > value + ATOL).sum() <= own["rank"] <= 1 + (row > value - ATOL).sum()
        assert isinstance(own["decoded_token"], str)
        assert len(entry) in (2, 3)
        assert sorted(v["rank"] for k, v in entry.items() if k != str(p[pos]) or own["rank"] <= 2) == [1, 2]


def test_chat_prompt_logprobs_are_top_level(server, ref):
    messages = [{"role": "user", "content": "hi there"}]
    with server.http() as h:
        ids = h.post("/tokenize", json={"messages": messages}).json()["tokens"]
    r = server.client().chat.completions.create(
        model="tiny", messages=messages, max_tokens=1, temperature=0, extra_body={"prompt_logprobs": 0}
    )
    pl = r.model_extra["prompt_logprobs"]
    ref_lp = ref(ids)
    assert len(pl) == len(ids) and pl[0] is None
    for pos in range(1, len(ids)):
        assert list(pl[pos]) == [str(ids[pos])]
        assert pl[pos][str(ids[pos])]["logprob"] == pytest.approx(ref_lp[pos - 1][ids[pos]], abs=ATOL)


def test_stream_echo_logprobs_cover_the_prompt_first(server, ref):
    p = _tokenize(server, PROMPTS[0])
    stream = server.client().completions.create(
        model="tiny",
        prompt=PROMPTS[0],
        echo=True,
        logprobs=1,
        max_tokens=3,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = [c for c in stream if c.choices]
    first = chunks[0].choices[0]
    assert first.text.startswith(PROMPTS[0])
    _check_prompt_part(first.logprobs, p, ref(p), len(p))
    tokens = [t for c in chunks for t in (c.choices[0].logprobs.tokens if c.choices[0].logprobs else [])]
    offsets = [
        o for c in chunks for o in (c.choices[0].logprobs.text_offset if c.choices[0].logprobs else [])
    ]
    assert len(tokens) == len(p) + 3
    assert "".join(tokens) == "".join(c.choices[0].text for c in chunks)
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]


def test_logit_bias_completions_and_chat(server, ref):
    c = server.client()
    p = _tokenize(server, PROMPTS[0])
    best = int(ref(p)[-1].argmax())
    target = (best + 17) % 300
    forced = c.completions.create(
        model="tiny",
        prompt=PROMPTS[0],
        max_tokens=3,
        temperature=0,
        logit_bias={str(target): 100},
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    assert forced.choices[0].model_extra["token_ids"] == [target] * 3
    banned = c.completions.create(
        model="tiny",
        prompt=PROMPTS[0],
        max_tokens=1,
        temperature=0,
        logit_bias={str(best): -100},
        extra_body={"return_token_ids": True},
    )
    second = int(ref(p)[-1].argsort()[-2])
    assert banned.choices[0].model_extra["token_ids"] == [second]
    chat = c.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=2,
        temperature=0,
        logit_bias={str(target): 100},
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    assert chat.choices[0].model_extra["token_ids"] == [target] * 2


def test_bad_logit_bias_is_a_400_naming_it(server):
    import openai

    with pytest.raises(openai.BadRequestError) as e:
        server.client().completions.create(model="tiny", prompt="hi", logit_bias={"7": 150})
    assert e.value.body["param"] == "logit_bias" and "between -100 and 100" in e.value.body["message"]


def test_max_tokens_0_stream_echo_sends_only_the_prompt(server):
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=60) as h:
        body = {"model": "tiny", "prompt": PROMPTS[0], "echo": True, "max_tokens": 0, "stream": True}
        with h.stream("POST", "/v1/completions", json=body) as r:
            events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    choices = [json.loads(e)["choices"][0] for e in events[:-1]]
    assert "".join(ch["text"] for ch in choices) == PROMPTS[0]
    assert choices[-1]["finish_reason"] == "length"
