"""The pure-Paddle reference ops against hand computations in numpy (float64 where it matters).
These are the oracle for the C++ kernels, so each is checked independently of the models."""

from __future__ import annotations

import numpy as np
import paddle
import pytest
from fd_kernels import reference as ref
from tiny_models import make_attention_metadata

rng = np.random.default_rng(0)


def t(a):
    return paddle.to_tensor(np.asarray(a, dtype=np.float32))


def test_rms_norm_and_fused_add():
    x, r, w = rng.normal(size=(5, 24)), rng.normal(size=(5, 24)), rng.normal(size=24)
    expected = x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(ref.rms_norm(t(x), t(w), 1e-5).numpy(), expected, atol=1e-5)
    normed, summed = ref.fused_add_rms_norm(t(x), t(r), t(w), 1e-5)
    s = x + r
    np.testing.assert_allclose(summed.numpy(), s, atol=1e-6)
    np.testing.assert_allclose(
        normed.numpy(), s / np.sqrt((s**2).mean(-1, keepdims=True) + 1e-5) * w, atol=1e-5
    )


def test_rotary_is_a_complex_rotation_of_half_pairs():
    num_tokens, nh, nkv, hd = 6, 4, 2, 8
    positions = np.array([0, 1, 2, 7, 30, 63])
    inv_freq = 1.0 / 10000 ** (np.arange(0, hd, 2) / hd)
    angles = np.arange(64)[:, None] * inv_freq
    cache = np.concatenate([np.cos(angles), np.sin(angles)], axis=-1)
    q, k = rng.normal(size=(num_tokens, nh * hd)), rng.normal(size=(num_tokens, nkv * hd))
    got_q, got_k = ref.rotary_embedding(paddle.to_tensor(positions), t(q), t(k), t(cache), hd)

    def rotate(x, heads):
        x = x.reshape(num_tokens, heads, hd)
        z = (x[..., : hd // 2] + 1j * x[..., hd // 2 :]) * np.exp(1j * angles[positions])[:, None, :]
        return np.concatenate([z.real, z.imag], axis=-1).reshape(num_tokens, heads * hd)

    np.testing.assert_allclose(got_q.numpy(), rotate(q, nh), atol=1e-5)
    np.testing.assert_allclose(got_k.numpy(), rotate(k, nkv), atol=1e-5)


def test_silu_and_mul():
    x = rng.normal(size=(3, 10))
    gate, up = x[:, :5], x[:, 5:]
    np.testing.assert_allclose(ref.silu_and_mul(t(x)).numpy(), gate / (1 + np.exp(-gate)) * up, atol=1e-6)


def test_linear_fp32_with_bias():
    w, b, x = rng.normal(size=(12, 8)), rng.normal(size=12), rng.normal(size=(3, 8))
    lw = ref.prepare_linear(w.astype(np.float32), b.astype(np.float32), None)
    assert lw.weight.shape == [8, 12] and (lw.in_features, lw.out_features) == (8, 12)
    np.testing.assert_allclose(ref.linear(t(x), lw).numpy(), x @ w.T + b, atol=1e-5)


@pytest.mark.parametrize("scheme, group, qmax", [("wint8", 128, 127), ("wint4", 64, 7)])
def test_weight_only_fake_quantization_scheme(scheme, group, qmax):
    """Dequantized weights are integer multiples (|q| <= qmax) of absmax/qmax per output row (wint8)
    or per 64-wide group (wint4), and the largest element of each group is represented exactly."""
    w = rng.normal(size=(6, 128)).astype(np.float32)
    w[2, :64] = 0.0  # an all-zero group must stay zero (scale 1, not a division by zero)
    deq = ref.prepare_linear(w, None, scheme).weight.numpy().T
    wg, dg = w.reshape(6, -1, group), deq.reshape(6, -1, group)
    scale = np.abs(wg).max(-1, keepdims=True) / qmax
    scale[scale == 0] = 1.0
    q = dg / scale
    np.testing.assert_allclose(q, np.round(q), atol=1e-3)
    assert np.abs(np.round(q)).max() <= qmax
    np.testing.assert_allclose(q, np.round(wg / scale), atol=1e-3)
    assert np.all(np.abs(dg - wg) <= scale / 2 + 1e-6)
    assert not np.array_equal(deq, w)


def test_wint4_short_last_group():
    """in=80: groups [0, 64) and [64, 80); the short group's scale is its own absmax / 7."""
    w = rng.normal(size=(3, 80)).astype(np.float32)
    deq = ref.prepare_linear(w, None, "wint4").weight.numpy().T
    tail_scale = np.abs(w[:, 64:]).max(-1, keepdims=True) / 7
    np.testing.assert_allclose(deq[:, 64:], np.round(w[:, 64:] / tail_scale) * tail_scale, atol=1e-6)


def test_prepare_linear_rejects_bad_input():
    with pytest.raises(ValueError, match="unknown quantization"):
        ref.prepare_linear(np.zeros((4, 64), np.float32), None, "fp8")


def test_reshape_and_cache_writes_each_slot():
    nb, nkv, bs, hd = 5, 2, 4, 3
    k_cache, v_cache = paddle.zeros([nb, nkv, bs, hd]), paddle.zeros([nb, nkv, bs, hd])
    slots = np.array([13, 2, 7, 19])
    k, v = rng.normal(size=(4, nkv, hd)), rng.normal(size=(4, nkv, hd))
    ref.reshape_and_cache(t(k), t(v), k_cache, v_cache, paddle.to_tensor(slots))
    exp_k, exp_v = np.zeros((nb, nkv, bs, hd)), np.zeros((nb, nkv, bs, hd))
    for i, s in enumerate(slots):
        exp_k[s // bs, :, s % bs] = k[i]
        exp_v[s // bs, :, s % bs] = v[i]
    np.testing.assert_allclose(k_cache.numpy(), exp_k, atol=1e-7)
    np.testing.assert_allclose(v_cache.numpy(), exp_v, atol=1e-7)


def dense_attention(q, k, v, scale):
    """q [Tq, nh, hd], k/v [L, nkv, hd]; the last Tq keys are the queries' own positions."""
    tq, nh, _ = q.shape
    length, nkv, _ = k.shape
    out = np.zeros_like(q)
    for h in range(nh):
        kv = h // (nh // nkv)
        s = q[:, h] @ k[:, kv].T * scale
        s[np.arange(length)[None, :] > (length - tq + np.arange(tq))[:, None]] = -np.inf
        p = np.exp(s - s.max(-1, keepdims=True))
        out[:, h] = (p / p.sum(-1, keepdims=True)) @ v[:, kv]
    return out


def test_paged_attention_mixed_batch_gqa():
    """Three sequences in one call: a fresh prefill, a decode token, and a chunk over a cached prefix;
    blocks scattered through the cache; 4 query heads over 2 KV heads."""
    nh, nkv, hd, bs, nb = 4, 2, 8, 4, 16
    # (cached, new, blocks): each sequence's full K/V is written to its blocks beforehand.
    seqs = [(0, 6, [9, 3]), (10, 1, [1, 14, 6]), (5, 4, [12, 0, 7])]
    k_cache, v_cache = paddle.zeros([nb, nkv, bs, hd]), paddle.zeros([nb, nkv, bs, hd])
    full_k, full_v, queries = [], [], []
    for cached, new, blocks in seqs:
        length = cached + new
        k, v = rng.normal(size=(length, nkv, hd)), rng.normal(size=(length, nkv, hd))
        slots = np.array([blocks[p // bs] * bs + p % bs for p in range(length)])
        ref.reshape_and_cache(t(k), t(v), k_cache, v_cache, paddle.to_tensor(slots))
        full_k.append(k)
        full_v.append(v)
        queries.append(rng.normal(size=(new, nh, hd)))
    meta, _ = make_attention_metadata(seqs, bs)
    got = ref.paged_attention(t(np.concatenate(queries)), k_cache, v_cache, meta, hd**-0.5).numpy()
    expected = np.concatenate(
        [dense_attention(q, k, v, hd**-0.5) for q, k, v in zip(queries, full_k, full_v, strict=True)]
    )
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_paged_attention_decode_batch():
    """Decode-only batch (the padded batched path): sequences of different lengths, one of them
    shorter than a block, unused block-table entries pointing at block 0 which holds other data."""
    nh, nkv, hd, bs, nb = 6, 2, 4, 4, 12
    seqs = [(8, 1, [3, 5, 9]), (1, 1, [0]), (4, 1, [7, 2])]
    k_cache = paddle.to_tensor(rng.normal(size=(nb, nkv, bs, hd)).astype(np.float32))
    v_cache = paddle.to_tensor(rng.normal(size=(nb, nkv, bs, hd)).astype(np.float32))
    kc, vc = k_cache.numpy(), v_cache.numpy()
    q = rng.normal(size=(3, nh, hd))
    meta, _ = make_attention_metadata(seqs, bs)
    assert meta.is_decode_only
    got = ref.paged_attention(t(q), k_cache, v_cache, meta, 0.5).numpy()
    for i, (cached, new, blocks) in enumerate(seqs):
        length = cached + new
        k = np.stack([kc[blocks[p // bs], :, p % bs] for p in range(length)])
        v = np.stack([vc[blocks[p // bs], :, p % bs] for p in range(length)])
        np.testing.assert_allclose(got[i], dense_attention(q[i : i + 1], k, v, 0.5)[0], atol=1e-5)
