"""Beam search (fdcli_engine/beam_search.py), vLLM's algorithm: the search alone against an exhaustive
search of a small synthetic model, and LLM.beam_search on a tiny checkpoint against transformers' own
beam search and its log-probabilities."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from tiny_models import load_hf_model

from fdcli_engine.beam_search import BeamSearchParams, BeamSearchSequence, beam_score, run, search
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


def _hf_log_prob(hf, prompt: list[int], generated: list[int]) -> float:
    import torch

    ids = torch.tensor([prompt + generated])
    with torch.no_grad():
        logp = torch.log_softmax(hf(ids).logits[0].double(), -1)
    return sum(float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(generated))


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


def test_llm_beam_search_width_over_max_logprobs_says_what_to_use(tiny):
    llm, _ = tiny
    with pytest.raises(InvalidRequestError, match="width of at most 10") as e:
        llm.beam_search(["hello"], BeamSearchParams(beam_width=11, max_tokens=2))
    assert e.value.param == "n"
