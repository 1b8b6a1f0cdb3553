"""Outputs of 32 MB or more (csrc/output_blocks.cc) live in one kept block that a later output of about
the same size reuses once the tensor holding it is gone: every call must still return its own values, two
live outputs must never share memory, and a reused block's stale values must all be overwritten."""

from __future__ import annotations

import gc

import numpy as np
from kernel_helpers import to_pd

# 256 x 32,768 fp32 = 32 MB, the smallest output the kept block serves.
M, K, N = 256, 32, 32768


def _linear(native, rng):
    w = rng.standard_normal((N, K), dtype=np.float32)
    return native.prepare_linear(w, None, None), w


def test_live_outputs_do_not_share_and_reused_blocks_are_rewritten(native, rng):
    lw, w = _linear(native, rng)
    xs = [rng.standard_normal((M, K), dtype=np.float32) for _ in range(3)]
    first = native.linear(to_pd(xs[0]), lw)
    second = native.linear(to_pd(xs[1]), lw)  # while `first` lives: another block
    assert first.data_ptr() != second.data_ptr()
    np.testing.assert_allclose(first.numpy(), xs[0] @ w.T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(second.numpy(), xs[1] @ w.T, rtol=1e-4, atol=1e-4)
    freed = first.data_ptr()
    del first
    gc.collect()
    third = native.linear(to_pd(xs[2]), lw)  # takes the block `first` held, full of its values
    assert third.data_ptr() == freed
    np.testing.assert_allclose(third.numpy(), xs[2] @ w.T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(second.numpy(), xs[1] @ w.T, rtol=1e-4, atol=1e-4)


def test_a_much_smaller_output_does_not_take_a_large_block(native, rng):
    lw, w = _linear(native, rng)
    big = native.linear(to_pd(rng.standard_normal((3 * M, K), dtype=np.float32)), lw)
    freed = big.data_ptr()
    del big
    gc.collect()
    x = rng.standard_normal((M, K), dtype=np.float32)
    y = native.linear(to_pd(x), lw)
    assert y.data_ptr() != freed
    np.testing.assert_allclose(y.numpy(), x @ w.T, rtol=1e-4, atol=1e-4)
