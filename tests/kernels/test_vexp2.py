"""vexp2_nonpos (csrc/vexp.h), the exp of the AMX prompt attention's online softmax, against float64 2^x
at every ISA level (test_isa.py re-runs this file under each). Its stated bound: relative error <= 3e-7
for -126 <= x <= 0 and on up to 8 (where the attention's lazy running max takes it), 2^0 exactly 1 (a
running max that did not move rescales by exactly 1), and an absolute error under 2^-126 below -126,
-inf included (masked keys weigh exactly 0)."""

from __future__ import annotations

import numpy as np
from kernel_helpers import to_pd


def test_relative_error_over_the_normal_range(native, rng):
    x = np.concatenate(
        [
            -rng.uniform(0, 126, 200_003),
            -rng.uniform(0, 1, 50_000),
            np.arange(-126, 1, dtype=np.float64) + 0.5,  # midpoints, where |f| = 1/2
            np.arange(-126, 1, dtype=np.float64),
        ]
    ).astype(np.float32)
    got = native.exp2_nonpos(to_pd(x)).numpy().astype(np.float64)
    want = np.exp2(x.astype(np.float64))
    rel = np.abs(got / want - 1)
    assert rel.max() <= 3e-7, (rel.max(), x[rel.argmax()])


def test_zero_is_exactly_one_and_the_underflow_is_zero(native):
    x = np.array([0.0, -0.0, -126.5, -149.0, -200.0, -1000.0, -3e38, -np.inf, 0.0], dtype=np.float32)
    got = native.exp2_nonpos(to_pd(x)).numpy()
    assert got[0] == 1.0 and got[1] == 1.0 and got[-1] == 1.0
    assert np.all(np.abs(got[2:-1]) < 2.0**-126)
    assert np.all(got[5:-1] == 0.0)


def test_the_bound_holds_up_to_the_lazy_max_threshold(native, rng):
    # 2^x for 0 < x <= 8 too (a running max that lags the scores by up to 8, as attn_amx.h's kAmxLazyMax
    # allows): the same reduction, the same bound.
    x = np.concatenate([rng.uniform(0, 8, 100_003), np.arange(0, 17) / 2]).astype(np.float32)
    got = native.exp2_nonpos(to_pd(x)).numpy().astype(np.float64)
    rel = np.abs(got / np.exp2(x.astype(np.float64)) - 1)
    assert rel.max() <= 3e-7, (rel.max(), x[rel.argmax()])
