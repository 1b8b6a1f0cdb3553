"""The bf16 KV cache (--kv-cache-dtype bfloat16): reshape_and_cache rounds each value to bf16, nearest even
(NaN -> 0x7FFF), on every ISA path (the vector body and the scalar tail), and the reference writes the same
bits. The oracle is numpy's evaluation of the rounding on the raw bits, independent of both. Attention over
bf16 caches is tested with the fp32 cache's sweeps (test_attention.py, test_attention_decode.py).
test_isa.py re-runs this file under every lower ISA path."""

from __future__ import annotations

import numpy as np
import paddle
import pytest
from kernel_helpers import to_pd


def np_bf16(x: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bits: round to nearest, ties to even, on the bits; every NaN -> 0x7FFF."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    r[np.isnan(x)] = 0x7FFF
    return r


def bits(cache) -> np.ndarray:
    return cache.view("uint16").numpy()


def special_values() -> np.ndarray:
    f = lambda u: np.array(u, dtype=np.uint32).view(np.float32)  # noqa: E731
    return np.concatenate(
        [
            # 1 + half an ulp (tie -> even 1.0), 1 + 3 half ulps (tie -> even up), just above / below a tie
            f([0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF]),
            f([0xBF808000, 0xBF818000]),  # the same ties, negative
            f([0x7F7FFFFF, 0x7F7F7FFF, 0x00000001, 0x00018000, 0x80008000]),  # max (-> inf), denormals
            np.array([np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0], np.float32),
            f([0x7F800001, 0xFFC12345]),  # a signalling NaN, a negative NaN with payload
        ]
    )


def test_paddle_cast_rounds_like_numpy():
    # The reference writes with Paddle's cast: it must be the rounding the kernels implement, on every bit
    # pattern class (one million random patterns, ~0.4% of them NaN, plus the special values).
    x = np.random.default_rng(0).integers(0, 2**32, 1 << 20, dtype=np.uint32).view(np.float32)
    x = np.concatenate([x, special_values()])
    np.testing.assert_array_equal(bits(paddle.to_tensor(x).astype("bfloat16")), np_bf16(x))


def empty_bf16(nb, nkv, bs, hd):
    return [paddle.zeros([nb, nkv, bs, hd], dtype="bfloat16") for _ in range(2)]


def write(impl, k, v, slots, cache):
    kc, vc = cache
    impl.reshape_and_cache(to_pd(k), to_pd(v), kc, vc, to_pd(slots))
    return bits(kc), bits(vc)


@pytest.mark.parametrize("t,nkv,hd,bs", [(1, 1, 64, 16), (50, 3, 64, 16), (33, 2, 10, 5), (200, 4, 24, 8)])
def test_reshape_and_cache_bits(native, ref, rng, t, nkv, hd, bs):
    nb = -(-t // bs) + 3
    # Magnitudes over 60 decades, and the special values spread over K (vector body and scalar tail).
    k = rng.standard_normal((t, nkv, hd), dtype=np.float32) * 10 ** rng.uniform(-30, 30, (t, nkv, 1))
    k = k.astype(np.float32)
    flat = k.reshape(-1)
    sv = special_values()
    flat[rng.permutation(flat.size)[: sv.size]] = sv[: flat.size]
    v = rng.standard_normal((t, nkv, hd), dtype=np.float32)
    slots = rng.permutation(nb * bs)[:t].astype(np.int64)
    if t > 1:
        slots[t // 2] = -1  # a padding token: skipped
    keep = slots >= 0
    got = write(native, k, v, slots, empty_bf16(nb, nkv, bs, hd))
    want = write(ref, k, v, slots, empty_bf16(nb, nkv, bs, hd))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    blk, off = slots[keep] // bs, slots[keep] % bs
    for h in range(nkv):
        np.testing.assert_array_equal(got[0][blk, h, off], np_bf16(k[keep, h]))
        np.testing.assert_array_equal(got[1][blk, h, off], np_bf16(v[keep, h]))
    written = np.zeros((nb, nkv, bs), bool)
    written[blk, :, off] = True
    assert not got[0][~written].any() and not got[1][~written].any()  # nothing else touched
    # Values read back within half a bf16 ulp: 8 significant bits, so 2^-8 relative.
    back = (got[1][blk, :, off].astype(np.uint32) << 16).view(np.float32)
    assert (np.abs(back - v[keep]) <= np.abs(v[keep]) * 2.0**-8).all()


def test_values_do_not_depend_on_the_batch(native, rng):
    # Prefix caching shares blocks written by another request's step.
    t, nkv, hd, bs = 12, 2, 40, 4
    k = rng.standard_normal((t, nkv, hd), dtype=np.float32)
    slots = np.arange(t, dtype=np.int64)
    together = write(native, k, -k, slots, empty_bf16(3, nkv, bs, hd))
    cache = empty_bf16(3, nkv, bs, hd)
    for i in range(t):
        alone = write(native, k[i : i + 1], -k[i : i + 1], slots[i : i + 1], cache)
    for a, b in zip(together, alone):
        np.testing.assert_array_equal(a, b)


def test_mixed_or_other_cache_dtypes_are_rejected(native, rng):
    from test_attention import make_batch

    q, kc, vc, meta = make_batch(rng, [2], [5], 2, 1, 16, 4, np.int32)
    kb = kc.astype("bfloat16")
    with pytest.raises(ValueError, match="v_cache must have k_cache's dtype"):
        native.paged_attention(q, kb, vc, meta, 1.0)
    with pytest.raises(ValueError, match="k_cache must be float32 or bfloat16"):
        native.paged_attention(q, kc.astype("float16"), vc.astype("float16"), meta, 1.0)
    k = to_pd(rng.standard_normal((2, 1, 16), dtype=np.float32))
    with pytest.raises(ValueError, match="v_cache must have k_cache's dtype"):
        native.reshape_and_cache(k, k, kb, vc, meta.slot_mapping)
