"""Sampled verification keeps the target's distribution (runner/spec_decode.py's argument, measured).

A 6-token vocabulary, two positions: row 0's distribution p1 (the first token) and row 1's p2 (the token
after the draft d1). With drafts [d1, d2] a step emits x1 ~ p1, and x2 ~ p2 only when x1 == d1 (then x3
would follow d2, which is drafted too). 20,000 verifications with the real Sampler: the frequencies of
x1 and of x2 given x1 == d1 must be p1 and p2 within a total-variation distance of 0.02 (the sampling
error at these counts is ~0.005-0.01; a biased rule, e.g. accepting d1 whenever p1(d1) > 0.2, is off by
more than 0.1). Seeded: the same numbers every run.
"""

from __future__ import annotations

import numpy as np

from fdcli_engine.runner.sampler import Sampler
from fdcli_engine.runner.spec_decode import accept, sampling_rows
from fdcli_engine.sampling_params import SamplingParams
from fdcli_engine.step_types import ScheduledRequest

V = 6
P1 = np.array([0.05, 0.35, 0.1, 0.3, 0.15, 0.05])
P2 = np.array([0.4, 0.02, 0.08, 0.2, 0.1, 0.2])
DRAFTS = [3, 0]
N = 20_000
TV_BOUND = 0.02


def _tv(counts: np.ndarray, p: np.ndarray) -> float:
    return 0.5 * float(np.abs(counts / counts.sum() - p).sum())


def test_sampled_verification_keeps_the_distribution():
    sampler = Sampler(seed=1234)
    params = SamplingParams(temperature=1.0, max_tokens=8)
    # Rows: the last known token, d1, d2. Row 2 (after d2) is never reached unless both match; give it p1.
    logits = np.log(np.stack([P1, P2, P1])).astype(np.float32)
    first = np.zeros(V)
    second = np.zeros(V)
    lengths = np.zeros(4)
    for i in range(N):
        sr = ScheduledRequest(
            req_id=f"r{i}",
            token_ids=[9, *DRAFTS],
            num_computed_tokens=10,
            block_ids=[0],
            sampling_params=params,
            do_sample=True,
            spec_token_ids=list(DRAFTS),
        )
        rows, views, starts = sampling_rows([sr], np.array([2]))
        assert rows.tolist() == [0, 1, 2] and starts == [0]
        tokens, _ = sampler.sample(logits[rows], views)
        emitted = accept(sr, tokens)
        lengths[len(emitted)] += 1
        first[emitted[0]] += 1
        if emitted[0] == DRAFTS[0]:
            second[emitted[1]] += 1
        else:
            assert len(emitted) == 1  # nothing after the first mismatch
    assert _tv(first, P1) < TV_BOUND
    assert second.sum() > 0.25 * N
    assert _tv(second, P2) < TV_BOUND
    # Acceptance of d1 is p1(d1); of d2 after it, p2(d2).
    assert abs(lengths[2:].sum() / N - P1[3]) < 0.015
    assert abs(lengths[3] / N - P1[3] * P2[0]) < 0.015


def test_rows_see_the_drafted_output():
    """Row j's request view has the drafts before it in its output (bans, penalties read it)."""
    params = SamplingParams(temperature=0, max_tokens=8)
    sr = ScheduledRequest(
        "a", [5, 6, 7], 4, [0], params, True, output_token_ids=[1, 2], spec_token_ids=[6, 7]
    )
    _, views, _ = sampling_rows([sr], np.array([2]))
    assert [v.output_token_ids for v in views] == [[1, 2], [1, 2, 6], [1, 2, 6, 7]]
    assert sr.output_token_ids == [1, 2]  # the shared list is not touched
