"""The C8 KV cache (--kv-cache-dtype int8): reshape_and_cache into int8 codes with one fp32 scale per
(token, KV head), and paged_attention reading them, against the pure-Paddle reference.

- Quantization: the kernel's codes and scales equal the reference's bit for bit, and both equal numpy's
  evaluation of the documented scheme (scale = absmax / 127, round half to even, zero row -> scale 1).
- Attention: native vs reference on the same int8 cache within 2e-5 absolute (both multiply the same
  codes by the same scales, so only the softmax summation order differs, as in test_attention.py), over
  the fp32 test's sweep plus odd head sizes, block boundaries and long contexts.
- Quality: int8 vs fp32 attention on unit-normal K/V. Each element moves by at most absmax / 254
  (~0.015 for 64 normal values), so a convex combination of values moves by about that much; the key
  error perturbs the logits by ~0.01. Bound: max 0.03, RMS 0.006 absolute.
test_isa.py re-runs this file under every lower ISA path.
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest
from kernel_helpers import to_pd
from test_attention import CASES, make_batch


def np_quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The scheme, computed independently in numpy float32."""
    scale = np.abs(x).max(axis=-1) / np.float32(127)
    scale[scale == 0] = 1
    q = np.clip(np.rint(x / scale[..., None]), -127, 127).astype(np.int8)
    return q, scale.astype(np.float32)


def empty_c8(nb, nkv, bs, hd):
    return [
        paddle.zeros([nb, nkv, bs, hd], dtype="int8"),
        paddle.zeros([nb, nkv, bs, hd], dtype="int8"),
        paddle.zeros([nb, nkv, bs], dtype="float32"),
        paddle.zeros([nb, nkv, bs], dtype="float32"),
    ]


def write(impl, k, v, slots, cache):
    kc, vc, ks, vs = cache
    impl.reshape_and_cache(to_pd(k), to_pd(v), kc, vc, to_pd(slots), ks, vs)
    return [x.numpy() for x in cache]


def c8_batch(rng, q_lens, ctx_lens, nh, nkv, hd, bs):
    """A make_batch batch plus its caches quantized: (q, fp32 k/v caches, meta, int8 k, int8 v, scales)."""
    q, kc, vc, meta = make_batch(rng, q_lens, ctx_lens, nh, nkv, hd, bs, np.int32)
    (kq, ks), (vq, vs) = np_quantize(kc.numpy()), np_quantize(vc.numpy())
    return q, kc, vc, meta, (to_pd(kq), to_pd(vq), to_pd(ks), to_pd(vs))


@pytest.mark.parametrize("t,nkv,hd,bs", [(1, 1, 64, 16), (50, 3, 64, 16), (33, 2, 10, 5), (200, 4, 128, 8)])
def test_reshape_and_cache_matches_reference_bit_for_bit(native, ref, rng, t, nkv, hd, bs):
    nb = -(-t // bs) + 3
    # Rows of very different magnitudes (as K rows of different tokens have), one all-zero row.
    k = rng.standard_normal((t, nkv, hd), dtype=np.float32) * 10 ** rng.uniform(-3, 3, (t, nkv, 1))
    k = k.astype(np.float32)
    v = rng.standard_normal((t, nkv, hd), dtype=np.float32)
    v[-1, 0] = 0.0
    slots = rng.permutation(nb * bs)[:t].astype(np.int64)  # scattered, crossing blocks
    got = write(native, k, v, slots, empty_c8(nb, nkv, bs, hd))
    want = write(ref, k, v, slots, empty_c8(nb, nkv, bs, hd))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    (kq, ks), (vq, vs) = np_quantize(k), np_quantize(v)
    blk, off = slots // bs, slots % bs
    for h in range(nkv):
        np.testing.assert_array_equal(got[0][blk, h, off], kq[:, h])
        np.testing.assert_array_equal(got[1][blk, h, off], vq[:, h])
        np.testing.assert_array_equal(got[2][blk, h, off], ks[:, h])
        np.testing.assert_array_equal(got[3][blk, h, off], vs[:, h])
    assert got[3][blk[-1], 0, off[-1]] == 1.0  # the zero row
    written = np.zeros((nb, nkv, bs), bool)
    written[blk, :, off] = True
    assert not got[0][~written].any() and not got[2][~written].any()  # nothing else touched
    # Dequantized rows are within half a step of the input.
    deq = got[0][blk, :, off].astype(np.float32) * got[2][blk, :, off][..., None]
    assert (np.abs(deq - k) <= got[2][blk, :, off][..., None] / 2 * (1 + 1e-6)).all()


def test_rounding_ties_to_even_and_clipping(native, ref):
    # absmax 127 -> scale 1 exactly, so x / scale = x: the ties are exact.
    row = np.zeros(16, np.float32)
    row[:9] = [127, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.49, -126.6]
    k = row.reshape(1, 1, 16)
    want = np.zeros(16, np.int8)
    want[:9] = [127, 0, 2, 2, 0, -2, -2, 3, -127]
    for impl in (native, ref):
        kc, _, ks, _ = write(impl, k, k, np.array([5]), empty_c8(2, 1, 4, 16))
        np.testing.assert_array_equal(kc[1, 0, 1], want)
        assert ks[1, 0, 1] == 1.0


def test_codes_do_not_depend_on_the_batch(native, rng):
    # Prefix caching shares blocks written by another request's step: a token's codes must be the same
    # whether it was written alone or with others.
    t, nkv, hd, bs = 12, 2, 32, 4
    k = rng.standard_normal((t, nkv, hd), dtype=np.float32)
    v = rng.standard_normal((t, nkv, hd), dtype=np.float32)
    slots = np.arange(t, dtype=np.int64)
    together = write(native, k, v, slots, empty_c8(3, nkv, bs, hd))
    cache = empty_c8(3, nkv, bs, hd)
    for i in range(t):
        alone = write(native, k[i : i + 1], v[i : i + 1], slots[i : i + 1], cache)
    for a, b in zip(together, alone):
        np.testing.assert_array_equal(a, b)


def test_negative_slots_are_skipped(native, rng):
    k = rng.standard_normal((2, 1, 16), dtype=np.float32)
    got = write(native, k, k, np.array([-1, 3]), empty_c8(1, 1, 4, 16))
    assert not got[0][0, 0, :3].any() and got[0][0, 0, 3].any()


SWEEP = CASES + [
    ([1, 1, 1, 1], [16, 17, 15, 32]),  # decode at, just past and just before block boundaries
    ([16, 1], [32, 1]),  # a chunk that ends exactly on a block boundary; a one-token sequence
]


@pytest.mark.parametrize("q_lens,ctx_lens", SWEEP)
@pytest.mark.parametrize("nh,nkv", [(4, 4), (9, 3), (8, 2)])
@pytest.mark.parametrize("bs,hd", [(16, 64), (5, 24), (16, 128), (8, 10)])
def test_attention_matches_reference(native, ref, rng, q_lens, ctx_lens, nh, nkv, bs, hd):
    q, kc, vc, meta, c8 = c8_batch(rng, q_lens, ctx_lens, nh, nkv, hd, bs)
    kq, vq, ks, vs = c8
    scale = hd**-0.5
    got = native.paged_attention(q, kq, vq, meta, scale, ks, vs).numpy()
    want = ref.paged_attention(q, kq, vq, meta, scale, ks, vs).numpy()
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)
    # The reference itself against fp32 attention over the unquantized cache (module docstring).
    err = want - ref.paged_attention(q, kc, vc, meta, scale).numpy()
    assert np.abs(err).max() < 0.03 and np.sqrt((err**2).mean()) < 0.006


@pytest.mark.parametrize("q_lens,ctx_lens", [([3, 1], [600, 301]), ([1], [2000]), ([1] * 8, [1000] * 8)])
def test_long_context(native, ref, rng, q_lens, ctx_lens):
    q, kc, vc, meta, (kq, vq, ks, vs) = c8_batch(rng, q_lens, ctx_lens, 6, 2, 64, 16)
    got = native.paged_attention(q * 4, kq, vq, meta, 0.5, ks, vs).numpy()
    want = ref.paged_attention(q * 4, kq, vq, meta, 0.5, ks, vs).numpy()
    # 4e-5: summing up to 2000 large-logit terms in two orders; the fp32 cache shows the same 2.4e-5
    # on these batches.
    np.testing.assert_allclose(got, want, atol=4e-5, rtol=0)


def test_fp32_and_int8_caches_are_not_mixed_up(native, rng):
    q, kc, vc, meta, (kq, vq, ks, vs) = c8_batch(rng, [2], [5], 2, 1, 16, 4)
    with pytest.raises(ValueError, match="k_cache must be int8"):
        native.paged_attention(q, kc, vc, meta, 1.0, ks, vs)
    with pytest.raises(ValueError, match="k_cache must be float32"):
        native.paged_attention(q, kq, vq, meta, 1.0)
    with pytest.raises(ValueError, match="scales must be"):
        native.paged_attention(q, kq, vq, meta, 1.0, ks[:, :, :2], vs[:, :, :2])
    k = to_pd(rng.standard_normal((2, 1, 16), dtype=np.float32))
    with pytest.raises(ValueError, match="scales must be"):
        native.reshape_and_cache(k, k, kq, vq, meta.slot_mapping, ks[:1], vs[:1])
