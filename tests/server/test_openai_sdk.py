"""The official openai SDK against a real `fd serve` (tiny random Llama). Greedy outputs are checked
against a step-by-step argmax of the transformers model; logprobs against its log-softmax."""

from __future__ import annotations

import math

import pytest

PROMPT = "the quick brown fox"
N_TOK = 8


@pytest.fixture(scope="module")
def hf(tiny_model):
    import torch
    from tiny_models import load_hf_model

    model = load_hf_model(tiny_model)

    def greedy(ids: list[int], n: int) -> tuple[list[int], list[float]]:
        """n argmax tokens after `ids` and each one's log-probability."""
        out, lps = [], []
        with torch.no_grad():
            for _ in range(n):
                logits = model(torch.tensor([ids + out])).logits[0, -1].double()
                logp = torch.log_softmax(logits, -1)
                out.append(int(logp.argmax()))
                lps.append(float(logp.max()))
        return out, lps

    return greedy


def _tokenize(server, **body) -> list[int]:
    with server.http() as h:
        r = h.post("/tokenize", json=body)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def test_models_lists_the_served_name(server):
    models = server.client().models.list()
    assert [m.id for m in models.data] == ["tiny"]


def test_completion_greedy_matches_transformers(server, hf):
    prompt_ids = _tokenize(server, prompt=PROMPT)
    r = server.client().completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=N_TOK,
        temperature=0,
        logprobs=2,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    choice = r.choices[0]
    ref_ids, ref_lps = hf(prompt_ids, N_TOK)
    assert choice.token_ids == ref_ids
    assert choice.finish_reason == "length"
    assert r.usage.prompt_tokens == len(prompt_ids) and r.usage.completion_tokens == N_TOK
    assert r.usage.total_tokens == len(prompt_ids) + N_TOK
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == N_TOK
    for got, want, top in zip(lp.token_logprobs, ref_lps, lp.top_logprobs):
        assert got == pytest.approx(want, abs=2e-3)
        # Greedy: the sampled token is the top-1. (Keys are token texts, so ids that decode alike collapse.)
        assert got >= max(top.values()) - 1e-6
        assert 1 <= len(top) <= 3
    assert "".join(lp.tokens) == choice.text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(N_TOK)]


def test_stream_equals_non_stream_completion(server):
    c = server.client()
    args = dict(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    full = c.completions.create(**args).choices[0]
    chunks = list(c.completions.create(stream=True, stream_options={"include_usage": True}, **args))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == full.text
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 12 and not chunks[-1].choices


def test_stream_equals_non_stream_chat(server):
    c = server.client()
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"}]
    args = dict(model="tiny", messages=msgs, max_tokens=10, temperature=0, extra_body={"ignore_eos": True})
    full = c.chat.completions.create(**args)
    chunks = list(c.chat.completions.create(stream=True, stream_options={"include_usage": True}, **args))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == full.choices[0].message.content
    assert full.choices[0].finish_reason == "length"
    assert chunks[-1].usage.model_dump()["completion_tokens"] == 10
    assert full.usage.prompt_tokens == len(_tokenize(server, messages=msgs))


def test_chat_text_parts_equal_plain_string(server):
    c = server.client()
    base = dict(model="tiny", max_tokens=6, temperature=0)
    plain = c.chat.completions.create(messages=[{"role": "user", "content": "hello\nworld"}], **base)
    parts = c.chat.completions.create(
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "hello"}, {"type": "text", "text": "world"}],
            }
        ],
        **base,
    )
    assert parts.choices[0].message.content == plain.choices[0].message.content
    assert parts.usage.prompt_tokens == plain.usage.prompt_tokens


def test_n_and_seed(server):
    c = server.client()
    args = dict(
        model="tiny", prompt=PROMPT, max_tokens=10, temperature=1.0, n=3, extra_body={"ignore_eos": True}
    )
    a = c.completions.create(seed=7, **args)
    b = c.completions.create(seed=7, **args)
    other = c.completions.create(seed=8, **args)
    assert [ch.index for ch in a.choices] == [0, 1, 2]
    assert [ch.text for ch in a.choices] == [ch.text for ch in b.choices]  # same seed, same samples
    assert len({ch.text for ch in a.choices}) > 1  # child i gets seed + i
    assert [ch.text for ch in other.choices] != [ch.text for ch in a.choices]
    assert a.usage.completion_tokens == 30


def test_n_streaming_chat_routes_each_choice(server):
    c = server.client()
    args = dict(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=6, n=2, seed=3)
    full = c.chat.completions.create(**args, extra_body={"ignore_eos": True})
    chunks = list(c.chat.completions.create(stream=True, **args, extra_body={"ignore_eos": True}))
    texts = {0: "", 1: ""}
    for ch in chunks:
        for choice in ch.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts == {ch.index: ch.message.content for ch in full.choices}


def test_stop_string_truncates(server):
    c = server.client()
    args = dict(model="tiny", prompt=PROMPT, max_tokens=16, temperature=0, extra_body={"ignore_eos": True})
    text = c.completions.create(**args).choices[0].text
    stop = text[4:6] if len(text) >= 6 else text[-2:]
    assert stop, "greedy output too short to pick a stop string"
    r = c.completions.create(stop=[stop], **args).choices[0]
    assert r.text == text[: text.find(stop)]
    assert r.finish_reason == "stop"
    kept = c.completions.create(stop=[stop], **{**args, "extra_body": {"include_stop_str_in_output": True}})
    assert kept.choices[0].text == text[: text.find(stop) + len(stop)]
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(stop=[stop], stream=True, **args))
    assert streamed == r.text


def test_chat_logprobs(server, hf):
    c = server.client()
    msgs = [{"role": "user", "content": "hello"}]
    r = c.chat.completions.create(
        model="tiny",
        messages=msgs,
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    ref_ids, ref_lps = hf(_tokenize(server, messages=msgs), 4)
    assert r.choices[0].token_ids == ref_ids
    content = r.choices[0].logprobs.content
    assert len(content) == 4
    for entry, want in zip(content, ref_lps):
        assert entry.logprob == pytest.approx(want, abs=2e-3)
        assert 1 <= len(entry.top_logprobs) <= 3
        assert math.isclose(entry.top_logprobs[0].logprob, entry.logprob, abs_tol=1e-6)


def test_prompt_forms_and_echo(server):
    c = server.client()
    ids = _tokenize(server, prompt=PROMPT)
    base = dict(model="tiny", max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
    by_text = c.completions.create(prompt=PROMPT, **base).choices[0].text
    by_ids = c.completions.create(prompt=ids, **base).choices[0].text
    assert by_ids == by_text
    both = c.completions.create(prompt=[PROMPT, "hello world"], **base)
    assert [ch.index for ch in both.choices] == [0, 1] and both.choices[0].text == by_text
    assert both.usage.prompt_tokens == len(ids) + len(_tokenize(server, prompt="hello world"))
    echoed = c.completions.create(prompt=PROMPT, echo=True, **base).choices[0].text
    assert echoed == PROMPT + by_text


def test_tokenize_round_trip(server):
    ids = _tokenize(server, prompt="hello world, this is a test")
    with server.http() as h:
        r = h.post("/detokenize", json={"tokens": ids})
        assert r.json()["prompt"] == "hello world, this is a test"
        v = h.get("/version").json()
        assert v["version"]


def test_cached_prompt_tokens_reported(server):
    c = server.client()
    long_prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * 6)
    c.completions.create(model="tiny", prompt=long_prompt, max_tokens=2)
    again = c.completions.create(model="tiny", prompt=long_prompt, max_tokens=2)
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached > 0 and cached % 16 == 0 and cached < again.usage.prompt_tokens
