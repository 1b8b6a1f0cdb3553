"""A batch of plain greedy rows (runner/sampler.py: no penalty, ban, logit_bias or grammar mask) skips the
`sample` op: its tokens must be the op's for the same rows (the first argmax: ties, infinities), and any
row that is not plain, or a NaN, must send the whole batch through the op. Both op implementations."""

from operator import attrgetter

import numpy as np
import pytest
from fd_kernels.sampler_layout import META_COLUMNS, PARAM_COLUMNS
from test_sampler import backend  # noqa: F401 - autouse: every test on both op implementations

from fdcli_engine import ops
from fdcli_engine.runner.sampler import Sampler, log_softmax
from fdcli_engine.sampling_params import SamplingParams
from fdcli_engine.step_types import ScheduledRequest

EOS = 2


@pytest.fixture
def op_calls(monkeypatch):
    calls = []
    sample = ops.sample
    monkeypatch.setattr(ops, "sample", lambda *a: calls.append(a[0].shape[0]) or sample(*a))
    return calls


def sreq(params, output=()):
    return ScheduledRequest(
        "r", [0], 0, [0], params, True, output_token_ids=list(output), prompt_token_ids=[1]
    )


def op_tokens(logits, params_list) -> list[int]:
    """The op on rows without penalty or ban ids: what a plain greedy row gets."""
    n, row = len(params_list), attrgetter(*PARAM_COLUMNS)
    params = np.array([row(p) for p in params_list], dtype=np.float64)
    meta = np.zeros((n, len(META_COLUMNS)), dtype=np.int64)
    return ops.sample(logits, params, np.zeros(0, np.int64), meta, np.zeros((n, 1)), False).tolist()


def tricky_logits(n=6, v=100, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    logits = rng.integers(-3, 4, size=(n, v)).astype(np.float32)  # many ties of the maximum
    logits[1] = -np.inf  # every token banned upstream: token 0
    logits[2, [7, 40]] = np.inf  # the first +inf
    logits[3, 5] = -0.0
    logits[3, 6:] = -1.0
    logits[3, :5] = -2.0
    logits[3, 99] = 0.0  # -0.0 and +0.0 tie: the first
    return logits


def test_plain_greedy_rows_get_the_ops_tokens(op_calls):
    logits = tricky_logits()
    params = [SamplingParams(temperature=0), SamplingParams(top_k=1, temperature=0.7)] * 3
    want = op_tokens(logits, params)
    op_calls.clear()
    tokens, logprobs = Sampler(eos_token_ids={EOS}).sample(logits, [sreq(p) for p in params])
    assert tokens == want
    assert op_calls == []  # the fast path ran
    assert logprobs == [None] * 6


def test_fast_path_logprobs_are_the_raw_distributions(op_calls):
    logits = np.random.default_rng(1).normal(size=(2, 50)).astype(np.float32)
    tokens, logprobs = Sampler().sample(logits, [sreq(SamplingParams(temperature=0, logprobs=2))] * 2)
    assert op_calls == []
    for i in range(2):
        lp = log_softmax(logits[i])
        # (token, logprob, rank): the sampled token's rank counts the more likely tokens, the top ones 1..k.
        assert logprobs[i][0] == (tokens[i], float(lp[tokens[i]]), 1 + int((lp > lp[tokens[i]]).sum()))
        assert [(t, r) for t, _, r in logprobs[i][1:]] == list(
            zip(np.argsort(-lp, kind="stable")[:2], (1, 2))
        )


@pytest.mark.parametrize(
    "other",
    [
        SamplingParams(temperature=0, repetition_penalty=1.3),
        SamplingParams(temperature=0, presence_penalty=0.5),
        SamplingParams(temperature=0, frequency_penalty=0.5),
        SamplingParams(temperature=0, logit_bias={3: 50.0}),
        SamplingParams(temperature=0, bad_words_token_ids=[[4]]),
        SamplingParams(temperature=0, min_tokens=5),
        SamplingParams(temperature=0.8, seed=3),
    ],
)
def test_one_row_that_is_not_plain_sends_the_batch_to_the_op(other, op_calls):
    logits = np.random.default_rng(2).normal(size=(2, 60)).astype(np.float32)
    logits[1, [3, 4, EOS]] = 10.0  # the row the bias, ban or min_tokens would change
    reqs = [sreq(SamplingParams(temperature=0)), sreq(other, output=[9, 9])]
    tokens, _ = Sampler(eos_token_ids={EOS}).sample(logits, reqs)
    assert op_calls == [2]
    assert tokens[0] == int(np.argmax(logits[0]))


def test_a_nan_row_goes_to_the_op(op_calls):
    logits = tricky_logits()
    logits[4, 10] = np.nan
    params = [SamplingParams(temperature=0)] * 6
    tokens, _ = Sampler().sample(logits, [sreq(p) for p in params])
    assert op_calls == [6]
    assert tokens == op_tokens(logits, params)
