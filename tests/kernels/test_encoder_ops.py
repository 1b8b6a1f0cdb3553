"""Encoder (BERT) ops: varlen_attention, gelu, add_layer_norm vs the Paddle reference ops, and the
reference itself vs float64 numpy. test_isa.py re-runs this file under the AVX2 and scalar paths.
Tolerances: 2e-5 absolute on attention outputs of unit-scale values (fp32 sums in another order,
vectorized exp); 1e-6 absolute for gelu (erfc approximation with error <= 1.5e-7); 1e-5 for layer norm."""

from __future__ import annotations

import math

import numpy as np
import pytest
from kernel_helpers import to_pd


def packed_qkv(rng, lens, nh, hd, *, fused=True, spread=1.0):
    """q, k, v [T, nh, hd]: column views of one fused [T, 3 * nh * hd] projection output (as BERT passes
    them) or separate contiguous tensors."""
    t, h = int(sum(lens)), nh * hd
    qkv = to_pd(rng.standard_normal((t, 3 * h), dtype=np.float32) * spread)
    if fused:
        return tuple(qkv[:, i * h : (i + 1) * h].reshape([t, nh, hd]) for i in range(3))
    return tuple(qkv[:, i * h : (i + 1) * h].contiguous().reshape([t, nh, hd]) for i in range(3))


def cu(lens, dtype=np.int32):
    return to_pd(np.concatenate([[0], np.cumsum(lens)]).astype(dtype))


def numpy_attention(q, k, v, lens, scale):
    q, k, v = (np.asarray(x.numpy(), dtype=np.float64) for x in (q, k, v))
    out, start = np.zeros_like(q), 0
    for n in lens:
        if n == 0:
            continue
        s = slice(start, start + n)
        scores = np.einsum("qhd,khd->hqk", q[s], k[s]) * scale
        p = np.exp(scores - scores.max(axis=-1, keepdims=True))
        out[s] = np.einsum("hqk,khd->qhd", p / p.sum(axis=-1, keepdims=True), v[s])
        start += n
    return out


LENGTHS = [
    [1],  # one token: attends only to itself
    [7],
    [16],  # exactly one score block / one AVX-512 tile
    [17, 15],  # one past and one short of a block
    [300],
    [512],  # BERT's longest input
    [1, 1, 1, 1, 1],
    [5, 0, 33, 1, 64],  # an empty sequence in the middle
]


@pytest.mark.parametrize("lens", LENGTHS, ids=lambda x: "-".join(map(str, x)))
@pytest.mark.parametrize("nh,hd", [(12, 32), (3, 33), (2, 7), (1, 64), (4, 1)])
def test_varlen_attention_matches_reference(native, ref, rng, lens, nh, hd):
    q, k, v = packed_qkv(rng, lens, nh, hd)
    scale = hd**-0.5
    got = native.varlen_attention(q, k, v, cu(lens), scale).numpy()
    want = ref.varlen_attention(q, k, v, cu(lens), scale).numpy()
    assert got.shape == (sum(lens), nh, hd)
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)


def test_varlen_attention_many_sequences(native, ref, rng):
    # 64 sequences of 1..160 tokens (a batch of sentences), int64 offsets, contiguous q/k/v.
    lens = [int(n) for n in rng.integers(1, 161, 64)]
    q, k, v = packed_qkv(rng, lens, 6, 24, fused=False)
    got = native.varlen_attention(q, k, v, cu(lens, np.int64), 0.2).numpy()
    want = ref.varlen_attention(q, k, v, cu(lens, np.int64), 0.2).numpy()
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)


def test_varlen_attention_large_logits(native, ref, rng):
    # Scores up to ~100: exp would overflow without subtracting the row max.
    lens = [40, 129]
    q, k, v = packed_qkv(rng, lens, 2, 16, spread=3.0)
    got = native.varlen_attention(q, k, v, cu(lens), 0.7).numpy()
    want = numpy_attention(q, k, v, lens, 0.7)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)  # outputs scale with v (spread 3)


def test_reference_attention_matches_numpy(ref, rng):
    lens = [3, 0, 20, 1]
    q, k, v = packed_qkv(rng, lens, 3, 8)
    got = ref.varlen_attention(q, k, v, cu(lens), 0.35).numpy()
    np.testing.assert_allclose(got, numpy_attention(q, k, v, lens, 0.35), atol=1e-5, rtol=0)


def test_varlen_attention_is_per_sequence(native, rng):
    # Changing sequence 1's keys must not change sequence 0's outputs (no attention across sequences).
    lens = [9, 12]
    q, k, v = packed_qkv(rng, lens, 2, 8, fused=False)
    before = native.varlen_attention(q, k, v, cu(lens), 0.3).numpy()
    k2 = k.numpy().copy()
    k2[9:] = rng.standard_normal(k2[9:].shape, dtype=np.float32)  # (a constant shift would cancel)
    after = native.varlen_attention(q, to_pd(k2), v, cu(lens), 0.3).numpy()
    np.testing.assert_array_equal(after[:9], before[:9])
    assert np.abs(after[9:] - before[9:]).max() > 1e-3


def test_varlen_attention_bad_input(native, rng):
    q, k, v = packed_qkv(rng, [4, 4], 2, 8)
    with pytest.raises(ValueError, match="cu_seqlens must start at 0 and end at the token count"):
        native.varlen_attention(q, k, v, cu([4, 3]), 1.0)
    with pytest.raises(ValueError, match="non-decreasing"):
        native.varlen_attention(q, k, v, to_pd(np.array([0, 5, 3, 8], np.int32)), 1.0)
    with pytest.raises(ValueError, match="shapes differ"):
        native.varlen_attention(q, k[:7], v, cu([4, 4]), 1.0)
    big = to_pd(np.zeros((2, 1, 513), np.float32))
    with pytest.raises(ValueError, match="head_dim must be 1..512"):
        native.varlen_attention(big, big, big, cu([2]), 1.0)


@pytest.mark.parametrize("shape", [(1, 1), (3, 37), (64, 1536), (1, 100_003)])
def test_gelu_matches_reference(native, ref, rng, shape):
    x = rng.standard_normal(shape, dtype=np.float32) * 3
    x.flat[:6] = [0.0, -0.0, 12.0, -12.0, 100.0, -100.0][: x.size]  # saturated tails on both sides
    xp = to_pd(x)
    np.testing.assert_allclose(native.gelu(xp).numpy(), ref.gelu(xp).numpy(), atol=1e-6, rtol=1e-6)


def test_gelu_infinities_as_reference(native, ref):
    # Paddle's gelu: inf -> inf, -inf -> nan (-inf * 0), huge values finite.
    x = to_pd(np.array([np.inf, -np.inf, 1e30, -1e30], np.float32))
    np.testing.assert_array_equal(native.gelu(x).numpy(), ref.gelu(x).numpy())


def test_gelu_matches_erf_definition(native):
    x = np.linspace(-9, 9, 4001, dtype=np.float32)
    want = np.array([0.5 * float(v) * (1 + math.erf(float(v) / math.sqrt(2))) for v in x])
    np.testing.assert_allclose(native.gelu(to_pd(x)).numpy(), want, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("t,h", [(1, 384), (5, 33), (70, 16), (300, 384)])
@pytest.mark.parametrize("offset", [0.0, 50.0])
def test_add_layer_norm_matches_reference(native, ref, rng, t, h, offset):
    # offset 50: |mean| >> std, where a one-pass E[x^2] - mean^2 variance would lose most digits. The
    # fp32 rounding of x + residual (~4e-6 at 50) then dominates, so both sides get a looser bound.
    x = rng.standard_normal((t, h), dtype=np.float32) * 2
    r = rng.standard_normal((t, h), dtype=np.float32) + np.float32(offset)
    w = rng.standard_normal(h, dtype=np.float32)
    b = rng.standard_normal(h, dtype=np.float32)
    xp, rp, wp, bp = to_pd(x), to_pd(r), to_pd(w), to_pd(b)
    got = native.add_layer_norm(xp, rp, wp, bp, 1e-12).numpy()
    atol = 1e-5 if offset == 0 else 4e-5
    np.testing.assert_allclose(got, ref.add_layer_norm(xp, rp, wp, bp, 1e-12).numpy(), atol=atol, rtol=1e-5)
    s = (x + r).astype(np.float64)  # the fp32 sum, then exact statistics
    want = (s - s.mean(-1, keepdims=True)) / np.sqrt(s.var(-1, keepdims=True) + 1e-12) * w + b
    np.testing.assert_allclose(got, want, atol=atol / 2, rtol=0)
    np.testing.assert_array_equal(rp.numpy(), r)  # inputs untouched


def test_add_layer_norm_bad_input(native, rng):
    x = to_pd(rng.standard_normal((3, 8), dtype=np.float32))
    with pytest.raises(ValueError, match="shapes differ"):
        native.add_layer_norm(x, x[:2], x[0], x[0], 1e-5)
    with pytest.raises(ValueError, match="must have 8 elements"):
        native.add_layer_norm(x, x, x[0, :4], x[0], 1e-5)
