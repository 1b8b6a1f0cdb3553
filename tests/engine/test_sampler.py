"""The sampler against hand computations (numpy). Every test runs on both implementations of the `sample`
op (the fused C++ kernel and its numpy reference) and, where the draw matters, both sampling classes."""

import numpy as np
import pytest
from ops_backend import switched_ops

from fdcli_engine import ops
from fdcli_engine.errors import ConfigError
from fdcli_engine.runner.sampler import Sampler, filter_probs, log_softmax
from fdcli_engine.sampling_params import SamplingParams
from fdcli_engine.step_types import ScheduledRequest


@pytest.fixture(autouse=True, params=["native", "reference"])
def backend(request):
    yield from switched_ops(request.param)


@pytest.fixture(params=["base", "rejection"])
def sampling_class(request):
    return request.param


def sreq(rid, params, prompt=(1, 2), output=()):
    return ScheduledRequest(
        req_id=rid,
        token_ids=[0],
        num_computed_tokens=0,
        block_ids=[0],
        sampling_params=params,
        do_sample=True,
        output_token_ids=list(output),
        prompt_token_ids=list(prompt),
    )


def rand_logits(n, v=64, seed=0):
    return np.random.default_rng(seed).normal(size=(n, v)).astype(np.float32) * 3


def test_greedy_is_argmax():
    logits = rand_logits(3)
    toks, _ = Sampler().sample(logits, [sreq(str(i), SamplingParams(temperature=0)) for i in range(3)])
    assert toks == list(np.argmax(logits, axis=1))


def test_seeded_sampling_independent_of_batch(sampling_class):
    params = SamplingParams(temperature=1.0, seed=1234)
    logits = rand_logits(4, seed=1)
    solo = Sampler(seed=0, sampling_class=sampling_class)
    mixed = Sampler(seed=99, sampling_class=sampling_class)
    solo_toks, mixed_toks = [], []
    for step in range(20):
        row = rand_logits(1, seed=100 + step)
        solo_toks.append(solo.sample(row.copy(), [sreq("a", params)])[0][0])
        batch = np.concatenate([logits[:2], row, logits[2:]])
        reqs = [
            sreq("x", SamplingParams(temperature=1.0)),
            sreq("y", SamplingParams(temperature=0.7, seed=5)),
        ]
        reqs.insert(2, sreq("a", params))
        reqs.append(sreq("z", SamplingParams(temperature=0)))
        mixed_toks.append(mixed.sample(batch[: len(reqs)], reqs)[0][2])
    assert solo_toks == mixed_toks
    assert len(set(solo_toks)) > 1  # really sampling, not greedy


def test_sampling_frequencies_follow_softmax(sampling_class):
    logits = np.array([[2.0, 1.0, 0.0, -1.0]], dtype=np.float32)
    s = Sampler(seed=7, sampling_class=sampling_class)
    params = SamplingParams(temperature=1.0)
    counts = np.zeros(4)
    n = 20000
    for _ in range(n):
        counts[s.sample(logits, [sreq("a", params)])[0][0]] += 1
    expected = np.exp(log_softmax(logits[0]))
    # 4 standard deviations of a binomial proportion.
    assert np.all(np.abs(counts / n - expected) < 4 * np.sqrt(expected * (1 - expected) / n))


def test_top_k_top_p_min_p_supports():
    row = np.log(np.array([0.5, 0.25, 0.15, 0.1], dtype=np.float32))
    p = filter_probs(row.copy(), SamplingParams(top_k=2))
    np.testing.assert_allclose(p, [2 / 3, 1 / 3, 0, 0], rtol=1e-5)
    p = filter_probs(row.copy(), SamplingParams(top_p=0.7))
    np.testing.assert_allclose(p, [2 / 3, 1 / 3, 0, 0], rtol=1e-5)
    p = filter_probs(row.copy(), SamplingParams(top_p=0.75))  # reaching 0.75 needs exactly two tokens
    np.testing.assert_allclose(p, [2 / 3, 1 / 3, 0, 0], rtol=1e-5)
    p = filter_probs(row.copy(), SamplingParams(min_p=0.29))  # keep p >= 0.145
    np.testing.assert_allclose(p, [0.5, 0.25, 0.15, 0] / np.float32(0.9), rtol=1e-5)
    p = filter_probs(row.copy(), SamplingParams(temperature=0.5))
    q = np.array([0.5, 0.25, 0.15, 0.1]) ** 2
    np.testing.assert_allclose(p, q / q.sum(), rtol=1e-5)


def test_penalties_by_hand():
    logits = np.array([[2.0, -2.0, 1.0, 0.5, 3.0]], dtype=np.float32)
    params = SamplingParams(temperature=0, repetition_penalty=2.0)
    s = Sampler()
    # Tokens 0 (positive) and 1 (negative) seen: 2.0 -> 1.0, -2.0 -> -4.0; argmax stays 4.
    assert s.sample(logits.copy(), [sreq("a", params, prompt=[0], output=[1])])[0] == [4]
    params = SamplingParams(temperature=0, frequency_penalty=1.0, presence_penalty=0.5)
    # Token 4 generated twice: 3.0 - 2*1.0 - 0.5 = 0.5 -> argmax becomes token 0 (2.0).
    assert s.sample(logits.copy(), [sreq("a", params, output=[4, 4])])[0] == [0]


def test_min_tokens_and_bad_words_masks():
    logits = np.array([[0.0, 5.0, 1.0, 4.0]], dtype=np.float32)
    s = Sampler(eos_token_ids={1})
    p = SamplingParams(temperature=0, min_tokens=2)
    assert s.sample(logits.copy(), [sreq("a", p, output=[2])])[0] == [3]
    assert s.sample(logits.copy(), [sreq("a", p, output=[2, 2])])[0] == [1]
    p = SamplingParams(temperature=0, min_tokens=3, stop_token_ids=[3])
    assert s.sample(logits.copy(), [sreq("a", p)])[0] == [2]
    p = SamplingParams(temperature=0)
    p.bad_words_token_ids = [[1], [0, 3]]
    assert s.sample(logits.copy(), [sreq("a", p, output=[2])])[0] == [3]
    assert s.sample(logits.copy(), [sreq("a", p, output=[0])])[0] == [2]


def test_logprobs_are_raw_and_sorted():
    logits = rand_logits(1, seed=3)
    params = SamplingParams(temperature=0, logprobs=3, repetition_penalty=1.5)
    toks, lps = Sampler().sample(logits.copy(), [sreq("a", params, prompt=[0, 1, 2, 3])])
    ref = log_softmax(logits[0])
    [entry] = lps
    assert entry[0][0] == toks[0]
    assert entry[0][1] == pytest.approx(float(ref[toks[0]]), abs=1e-6)
    top = [t for t, _, _ in entry[1:]]
    assert top == list(np.argsort(-ref)[:3])
    assert [v for _, v, _ in entry[1:]] == pytest.approx([float(ref[t]) for t in top], abs=1e-6)
    assert [r for _, _, r in entry[1:]] == [1, 2, 3]  # vLLM's ranks of the top-k


def test_sampled_token_rank_counts_the_more_likely_tokens():
    """The sampled token's rank is 1 + the tokens with a higher logprob (vLLM's), also when sampling
    picked an unlikely one: here the logit_bias forces the least likely token."""
    logits = rand_logits(1, seed=5)
    worst = int(np.argmin(logits[0]))
    params = SamplingParams(temperature=0, logprobs=0, logit_bias={worst: 100})
    toks, [entry] = Sampler().sample(logits.copy(), [sreq("a", params)])
    assert toks == [worst] and len(entry) == 1
    assert entry[0][2] == logits.shape[1]  # every other token is more likely by the raw logits
    params = SamplingParams(temperature=0, logprobs=0)
    toks, [entry] = Sampler().sample(logits.copy(), [sreq("b", params)])
    assert entry[0][2] == 1


def test_filtered_sampling_frequencies(sampling_class):
    # top-k 3 and top-p 0.8 over a 6-token row, drawn many times through the whole Sampler.
    logits = np.array([[1.0, 2.0, 0.5, 1.5, -1.0, 0.0]], dtype=np.float32)
    params = SamplingParams(temperature=1.0, top_k=3, top_p=0.8)
    expected = filter_probs(logits[0].copy(), params)
    s = Sampler(seed=3, sampling_class=sampling_class)
    n = 20000
    counts = np.zeros(6)
    for _ in range(n):
        counts[s.sample(logits, [sreq("a", params)])[0][0]] += 1
    assert counts[expected == 0].sum() == 0
    assert np.all(np.abs(counts / n - expected) < 4 * np.sqrt(expected * (1 - expected) / n) + 1e-12)


def test_greedy_and_seeded_tokens_are_the_same_on_both_implementations():
    rng = np.random.default_rng(8)
    logits = rng.normal(size=(6, 3000)).astype(np.float32) * 3
    kinds = [
        SamplingParams(temperature=0, repetition_penalty=1.4, frequency_penalty=0.3, presence_penalty=0.2),
        SamplingParams(temperature=0.8, top_p=0.9, seed=11),
        SamplingParams(temperature=1.0, top_k=40, min_p=0.02, seed=12),
        SamplingParams(top_k=1),
        SamplingParams(temperature=0.6, repetition_penalty=0.9, seed=13, min_tokens=5, stop_token_ids=[7]),
        SamplingParams(temperature=0),
    ]
    reqs = [
        sreq(str(i), p, prompt=rng.integers(0, 3000, 30).tolist(), output=[5, 5, 9])
        for i, p in enumerate(kinds)
    ]
    before = ops.backend
    try:
        toks = {}
        for name in ("native", "reference"):
            ops.use(name)
            toks[name] = [Sampler().sample(logits.copy(), reqs)[0] for _ in range(3)]
    finally:
        ops.use(before)
    assert toks["native"] == toks["reference"]


def test_unknown_sampling_class_is_a_config_error(monkeypatch):
    monkeypatch.setenv("FD_SAMPLING_CLASS", "bogus")
    with pytest.raises(ConfigError, match="FD_SAMPLING_CLASS='bogus'.*base or rejection"):
        Sampler()
    monkeypatch.setenv("FD_SAMPLING_CLASS", "Rejection")
    assert Sampler().sampling_class == "rejection"
    monkeypatch.delenv("FD_SAMPLING_CLASS")
    assert Sampler().sampling_class == "base"
