"""Beam search (fdcli_engine/beam_search.py), vLLM's algorithm: the search alone against an exhaustive
search of a small synthetic model, and LLM.beam_search on a tiny checkpoint against transformers' own
beam search and its log-probabilities."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from tiny_models import load_hf_model

from fdcli_engine.beam_search import (
    BeamSearchParams,
    BeamSearchSequence,
    beam_score,
    completion_outputs,
    run,
    search,
)
from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.outputs import Logprob

VOCAB, EOS = 4, 3


def _table(prefix: tuple[int, ...]) -> dict[int, Logprob]:
    """A fixed random next-token distribution for each prefix (log-softmax of seeded scores)."""
    rng = random.Random(hash(prefix) & 0xFFFFFFFF)
    scores = [rng.uniform(-2, 2) for _ in range(VOCAB)]
    norm = math.log(sum(math.exp(s) for s in scores))
    ranked = sorted(range(VOCAB), key=lambda t: -scores[t])
    return {t: Logprob(t, scores[t] - norm, rank=r + 1) for r, t in enumerate(ranked)}


def _synthetic_step(batch: list[list[int]]) -> list[dict[int, Logprob]]:
    return [_table(tuple(tokens)) for tokens in batch]


def _exhaustive(prompt: list[int], depth: int, length_penalty: float) -> list[tuple[float, list[int]]]:
    """Every sequence the search could return, (score, tokens) best first: a run of non-EOS tokens
    ended by EOS (EOS left out of the tokens, as include_stop_str_in_output=False), or `depth` of them."""
    found = []
    for n in range(depth + 1):
        for body in itertools.product(range(VOCAB - 1), repeat=n):
            cum, tokens = 0.0, list(prompt)
            for t in body:
                cum += _table(tuple(tokens))[t].logprob
                tokens.append(t)
            if n < depth:  # ended by EOS
                beam = BeamSearchSequence(tokens, cum_logprob=cum + _table(tuple(tokens))[EOS].logprob)
            elif n == depth:
                beam = BeamSearchSequence(tokens, cum_logprob=cum)
            found.append((beam_score(beam, {EOS}, length_penalty), beam.tokens))
    return sorted(found, key=lambda f: -f[0])


@pytest.mark.parametrize("length_penalty", [1.0, 0.0, 2.0])
def test_a_wide_search_returns_the_exhaustive_best(length_penalty):
    """Width 16 over 3 tokens and 3 steps keeps every sequence that can rank among the best 16."""
    prompt = [0, 1]
    params = BeamSearchParams(beam_width=16, max_tokens=3, length_penalty=length_penalty)
    [out] = run(search([prompt], params, {EOS}), _synthetic_step)
    want = _exhaustive(prompt, 3, length_penalty)[:16]
    got = [(beam_score(b, {EOS}, length_penalty), b.tokens) for b in out.sequences]
    assert [t for _, t in got] == [t for _, t in want]
    assert all(math.isclose(a, b, abs_tol=1e-12) for (a, _), (b, _) in zip(got, want))


def test_width_one_with_ignore_eos_is_greedy():
    tokens = [2]
    for _ in range(6):
        tokens.append(max(_table(tuple(tokens)).values(), key=lambda lp: lp.logprob).token_id)
    params = BeamSearchParams(beam_width=1, max_tokens=6, ignore_eos=True)
    [out] = run(search([[2]], params, {EOS}), _synthetic_step)
    assert out.sequences[0].tokens == tokens and EOS in tokens  # EOS is an ordinary token then


def test_each_prompt_is_searched_on_its_own():
    params = BeamSearchParams(beam_width=3, max_tokens=3)
    both = run(search([[0], [1, 2]], params, {EOS}), _synthetic_step)
    alone = [run(search([p], params, {EOS}), _synthetic_step)[0] for p in ([0], [1, 2])]
    assert [[s.tokens for s in o.sequences] for o in both] == [[s.tokens for s in o.sequences] for o in alone]


def _sequences(out):
    return [(s.tokens, s.cum_logprob, s.finish_reason) for s in out.sequences]


@pytest.mark.parametrize("width", [1, 2])
def test_a_step_with_more_logprobs_searches_the_same(width):
    """A request that asks its answer for more logprobs than 2 x beam_width gets a step with that many;
    the search still weighs the 2 x beam_width best (vLLM's), so an end-of-sequence token further down
    ends no beam."""

    def vllm_step(batch):
        return [{t: lp for t, lp in _table(tuple(b)).items() if lp.rank <= 2 * width} for b in batch]

    params = BeamSearchParams(beam_width=width, max_tokens=4, length_penalty=0.0)
    prompts = [[p, q] for p in range(VOCAB - 1) for q in range(VOCAB - 1)]
    want = run(search(prompts, params, {EOS}), vllm_step)
    got = run(search(prompts, params, {EOS}), _synthetic_step)
    assert [_sequences(o) for o in got] == [_sequences(o) for o in want]


@pytest.mark.parametrize("num", [0, 1, 3])
def test_answer_logprobs_are_each_tokens_with_the_best_alternatives(num):
    """Each generated token's entry as a sampled request's: the token first, then the step's `num` best;
    a beam stopped by EOS (left out of its tokens) has its EOS logprob in the cumulative logprob alone."""
    params = BeamSearchParams(beam_width=3, max_tokens=4)
    prompts = [[p, q] for p in range(VOCAB - 1) for q in range(VOCAB - 1)]
    outs = run(search(prompts, params, {EOS}), _synthetic_step)
    assert any(s.finish_reason == "stop" for o in outs for s in o.sequences)
    for prompt, out in zip(prompts, outs):
        comps = completion_outputs(out, len(prompt), lambda ids: "", logprobs=num)
        for seq, comp in zip(out.sequences, comps):
            assert len(comp.logprobs) == len(comp.token_ids)
            total = 0.0
            for i, (token, entry) in enumerate(zip(comp.token_ids, comp.logprobs)):
                table = _table(tuple(seq.tokens[: len(prompt) + i]))
                best = sorted(table, key=lambda t: -table[t].logprob)[:num]
                assert list(entry)[0] == token and set(entry) == {token, *best}
                assert all(entry[t].logprob == table[t].logprob for t in entry)
                total += entry[token].logprob
            if seq.finish_reason == "stop":
                total += _table(tuple(seq.tokens))[EOS].logprob
            assert total == pytest.approx(seq.cum_logprob, abs=1e-12)
        assert all(c.logprobs is None for c in completion_outputs(out, len(prompt), lambda ids: ""))


@pytest.mark.parametrize(
    "kwargs, param",
    [({"beam_width": 0}, "n"), ({"max_tokens": 0}, "max_tokens"), ({"temperature": -1}, "temperature")],
)
def test_bad_params_are_invalid_requests(kwargs, param):
    with pytest.raises(InvalidRequestError) as e:
        BeamSearchParams(**{"beam_width": 2, "max_tokens": 2, **kwargs})
    assert e.value.param == param


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from fdcli_engine import LLM

    folder = tiny_model_dir("LlamaForCausalLM")
    return LLM(str(folder), max_model_len=128, block_size=8, num_kv_blocks=64), load_hf_model(folder)


def _hf_steps(hf, prompt: list[int], generated: list[int]):
    """transformers' next-token log-probabilities at each generated position, teacher-forced."""
    import torch

    ids = torch.tensor([prompt + generated])
    with torch.no_grad():
        logp = torch.log_softmax(hf(ids).logits[0].double(), -1)
    return logp[len(prompt) - 1 : len(prompt) - 1 + len(generated)]


def _hf_log_prob(hf, prompt: list[int], generated: list[int]) -> float:
    return sum(float(row[t]) for row, t in zip(_hf_steps(hf, prompt, generated), generated))


def test_llm_beam_search_matches_transformers(tiny):
    """ignore_eos, 5 steps, width 3: transformers' three beams, in its order, and each beam's cumulative
    logprob equal to transformers' log-probability of its tokens."""
    import torch

    llm, hf = tiny
    prompt = llm.tokenizer.encode("the quick brown fox")
    params = BeamSearchParams(beam_width=3, max_tokens=5, ignore_eos=True)
    [out] = llm.beam_search([{"prompt_token_ids": prompt}], params)
    with torch.no_grad():
        ref = hf.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            num_beams=3,
            num_return_sequences=3,
            do_sample=False,
            max_new_tokens=5,
            min_new_tokens=5,
            eos_token_id=None,
            pad_token_id=0,
            length_penalty=1.0,
        )
    want = [row[len(prompt) :].tolist() for row in ref]
    got = [s.tokens[len(prompt) :] for s in out.sequences]
    assert got == want
    for seq, gen in zip(out.sequences, got):
        assert seq.cum_logprob == pytest.approx(_hf_log_prob(hf, prompt, gen), abs=2e-3)
        assert seq.text == llm.tokenizer.backend.decode(seq.tokens) and seq.finish_reason is None
        assert len(seq.logprobs) == 5


def test_llm_beam_search_logprobs_are_the_models(tiny):
    """Each beam's per-step logprobs dicts (vLLM's BeamSearchSequence.logprobs): the 2 x beam_width most
    likely next tokens after the beam's prefix with transformers' log-probabilities, the beam's own
    token among them; its tokens' logprobs add up to the cumulative logprob."""
    llm, hf = tiny
    prompt = llm.tokenizer.encode("hello world")
    params = BeamSearchParams(beam_width=2, max_tokens=4, ignore_eos=True)
    [out] = llm.beam_search([{"prompt_token_ids": prompt}], params)
    for seq in out.sequences:
        gen = seq.tokens[len(prompt) :]
        rows = _hf_steps(hf, prompt, gen)
        assert len(seq.logprobs) == len(gen)
        for token, entry, row in zip(gen, seq.logprobs, rows):
            assert token in entry and set(entry) == set(row.topk(4).indices.tolist())
            for t, lp in entry.items():
                assert lp.logprob == pytest.approx(float(row[t]), abs=2e-3)
        total = sum(entry[t].logprob for t, entry in zip(gen, seq.logprobs))
        assert total == pytest.approx(seq.cum_logprob, abs=1e-9)


def test_llm_beam_search_width_over_max_logprobs_says_what_to_use(tiny):
    llm, _ = tiny
    with pytest.raises(InvalidRequestError, match="width of at most 10") as e:
        llm.beam_search(["hello"], BeamSearchParams(beam_width=11, max_tokens=2))
    assert e.value.param == "n"
