"""rms_norm, fused_add_rms_norm, silu_and_mul, rotary_embedding, reshape_and_cache vs the Paddle
reference ops. Tolerances: 1e-5 relative for the norms (one fp32 reduction in another order), 2e-6
absolute on unit-scale values for silu (vectorized exp, ~2e-7 relative) and rotary."""

from __future__ import annotations

import numpy as np
import paddle
import pytest
from kernel_helpers import to_pd


@pytest.mark.parametrize("t,h", [(1, 576), (7, 33), (64, 17), (300, 576)])
def test_rms_norms(native, ref, rng, t, h):
    x = rng.standard_normal((t, h), dtype=np.float32) * 3
    r = rng.standard_normal((t, h), dtype=np.float32)
    w = rng.standard_normal(h, dtype=np.float32)
    xp, rp, wp = to_pd(x), to_pd(r), to_pd(w)
    np.testing.assert_allclose(
        native.rms_norm(xp, wp, 1e-5).numpy(), ref.rms_norm(xp, wp, 1e-5).numpy(), rtol=1e-5, atol=1e-5
    )
    out, res = native.fused_add_rms_norm(xp, rp, wp, 1e-6)
    rout, rres = ref.fused_add_rms_norm(xp, rp, wp, 1e-6)
    np.testing.assert_array_equal(res.numpy(), rres.numpy())  # one fp32 add: exact
    np.testing.assert_allclose(out.numpy(), rout.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(rp.numpy(), r)  # inputs untouched


def test_strided_inputs_are_read_correctly(native, ref, rng):
    # Column slices (strided views) of a wider activation, as a fused projection's output is split.
    big = to_pd(rng.standard_normal((9, 100), dtype=np.float32))
    x, r = big[:, 3:35], big[:, 40:72]
    w = to_pd(rng.standard_normal(32, dtype=np.float32))
    np.testing.assert_allclose(
        native.rms_norm(x, w, 1e-5).numpy(), ref.rms_norm(x, w, 1e-5).numpy(), rtol=1e-5, atol=1e-5
    )
    out, res = native.fused_add_rms_norm(x, r, w, 1e-5)
    rout, rres = ref.fused_add_rms_norm(x, r, w, 1e-5)
    np.testing.assert_array_equal(res.numpy(), rres.numpy())
    np.testing.assert_allclose(out.numpy(), rout.numpy(), rtol=1e-5, atol=1e-5)
    g = big[:, 10:90]
    np.testing.assert_allclose(
        native.silu_and_mul(g).numpy(), ref.silu_and_mul(g).numpy(), rtol=2e-6, atol=2e-6
    )


@pytest.mark.parametrize("t,i", [(1, 1536), (5, 37), (70, 16)])
def test_silu_and_mul(native, ref, rng, t, i):
    x = rng.standard_normal((t, 2 * i), dtype=np.float32) * 4
    x[0, :3] = [-100.0, 100.0, 0.0]  # saturated exp on both sides
    xp = to_pd(x)
    got, want = native.silu_and_mul(xp).numpy(), ref.silu_and_mul(xp).numpy()
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)


def test_silu_and_mul_error_bound(native, rng):
    """vexp.h's stated bound against float64, on the vector body and the scalar tail of each row (1543 =
    96 * 16 + 7): relative error <= 5e-7 + 7.3e-8 |a| for -87 <= a < 0 and <= 5e-7 for a >= 0; below
    -87 the value is a denormal or 0, off by under 2^-126 |a up|."""
    n = 1543
    a = np.concatenate(
        [
            rng.uniform(-100, 100, 40 * n),
            rng.uniform(-20, 20, 40 * n),
            np.geomspace(1e-30, 100, 20 * n) * rng.choice([-1.0, 1.0], 20 * n),
        ]
    ).astype(np.float32)
    up = rng.uniform(0.5, 2.0, a.size).astype(np.float32)
    x = np.concatenate([a.reshape(-1, n), up.reshape(-1, n)], axis=1)
    got = native.silu_and_mul(to_pd(x)).numpy().ravel().astype(np.float64)
    a64, up64 = a.astype(np.float64), up.astype(np.float64)
    want = a64 / (1.0 + np.exp(-a64)) * up64
    rel = 5e-7 + 7.3e-8 * np.abs(a64) * (a64 < 0)
    bound = np.where(a64 >= -87, rel * np.abs(want), 2.0**-126 * np.abs(a64 * up64))
    worst = np.argmax(np.abs(got - want) - bound)
    assert np.all(np.abs(got - want) <= bound), (a[worst], got[worst], want[worst])


def test_silu_and_mul_special_values(native):
    """-0 keeps its sign, NaN stays NaN, +inf gives inf * up, -inf gives NaN (-inf * sigmoid(-inf) =
    -inf * 0), huge |a| saturates to a * up or to -0 (never NaN from inf / inf or a * up overflowing):
    at the start of a row (vector body) and at its end (scalar tail where the width leaves one)."""
    special = np.array([-0.0, np.nan, np.inf, -np.inf, -1e4, 1e4, -3e38, 3e38, -88.0, 88.0, 0.0], np.float32)
    k = special.size
    for n in (k, 32 + k):
        g = np.ones(n, np.float32)
        g[:k], g[n - k :] = special, special
        up = np.full(n, 2.0, np.float32)
        got = native.silu_and_mul(to_pd(np.concatenate([g, up])[None, :])).numpy()[0]
        with np.errstate(all="ignore"):
            g64 = g.astype(np.float64)
            want = (g64 / (1.0 + np.exp(-g64)) * 2.0).astype(np.float32)
        finite = ~np.isnan(want)
        np.testing.assert_array_equal(np.signbit(got[finite]), np.signbit(want[finite]))
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=2.0**-126 * 88 * 2)


def _cos_sin(max_pos, hd, base=10000.0):
    inv = 1.0 / base ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = np.arange(max_pos)[:, None] * inv[None, :]
    return np.concatenate([np.cos(ang), np.sin(ang)], axis=1).astype(np.float32)


@pytest.mark.parametrize("t,nh,nkv,hd", [(1, 9, 3, 64), (13, 4, 4, 32), (40, 6, 2, 10)])
def test_rotary_in_place(native, ref, rng, t, nh, nkv, hd):
    cs = to_pd(_cos_sin(300, hd))
    pos = rng.integers(0, 300, size=t).astype(np.int64)
    q = rng.standard_normal((t, nh * hd), dtype=np.float32)
    k = rng.standard_normal((t, nkv * hd), dtype=np.float32)
    rq, rk = ref.rotary_embedding(to_pd(pos), to_pd(q), to_pd(k), cs, hd)
    qp, kp = to_pd(q), to_pd(k)
    oq, ok = native.rotary_embedding(to_pd(pos), qp, kp, cs, hd)
    np.testing.assert_allclose(qp.numpy(), rq.numpy(), atol=2e-6)  # in place
    np.testing.assert_allclose(ok.numpy(), rk.numpy(), atol=2e-6)
    assert oq is qp and ok is kp


def test_rotary_on_fused_qkv_views(native, ref, rng):
    # The attention layer slices q and k out of one qkv projection: strided views; the returned tensors
    # carry the rotation.
    t, nh, nkv, hd = 6, 3, 1, 16
    qkv = rng.standard_normal((t, (nh + 2 * nkv) * hd), dtype=np.float32)
    cs, pos = to_pd(_cos_sin(64, hd)), to_pd(np.arange(t, dtype=np.int32) + 5)  # int32 positions too
    rq, rk = ref.rotary_embedding(
        pos.astype("int64"), to_pd(qkv[:, : nh * hd]), to_pd(qkv[:, nh * hd : (nh + nkv) * hd]), cs, hd
    )
    buf = to_pd(qkv)
    q, k = buf[:, : nh * hd], buf[:, nh * hd : (nh + nkv) * hd]
    q, k = native.rotary_embedding(pos, q, k, cs, hd)
    np.testing.assert_allclose(q.numpy(), rq.numpy(), atol=2e-6)
    np.testing.assert_allclose(k.numpy(), rk.numpy(), atol=2e-6)
    np.testing.assert_array_equal(buf.numpy()[:, (nh + nkv) * hd :], qkv[:, (nh + nkv) * hd :])  # v untouched


def test_rotary_rejects_out_of_range_position(native):
    cs = to_pd(_cos_sin(8, 4))
    with pytest.raises(ValueError, match="out of range"):
        native.rotary_embedding(to_pd(np.array([8])), paddle.zeros([1, 4]), paddle.zeros([1, 4]), cs, 4)


@pytest.mark.parametrize("slot_dtype", ["int64", "int32"])
def test_reshape_and_cache(native, ref, rng, slot_dtype):
    nb, nkv, bs, hd, t = 6, 2, 5, 8, 9
    k = rng.standard_normal((t, nkv, hd), dtype=np.float32)
    v = rng.standard_normal((t, nkv, hd), dtype=np.float32)
    slots = rng.permutation(nb * bs)[:t].astype(np.int64)
    kc0 = rng.standard_normal((nb, nkv, bs, hd), dtype=np.float32)
    vc0 = rng.standard_normal((nb, nkv, bs, hd), dtype=np.float32)
    rkc, rvc = to_pd(kc0), to_pd(vc0)
    ref.reshape_and_cache(to_pd(k), to_pd(v), rkc, rvc, to_pd(slots))
    kc, vc = to_pd(kc0), to_pd(vc0)
    native.reshape_and_cache(to_pd(k), to_pd(v), kc, vc, to_pd(slots.astype(slot_dtype)))
    np.testing.assert_array_equal(kc.numpy(), rkc.numpy())
    np.testing.assert_array_equal(vc.numpy(), rvc.numpy())
    # A negative slot (padding) writes nothing.
    before = kc.numpy().copy()
    native.reshape_and_cache(to_pd(k[:1] + 1), to_pd(v[:1]), kc, vc, to_pd(np.array([-1])))
    np.testing.assert_array_equal(kc.numpy(), before)
    with pytest.raises(ValueError, match="beyond the cache"):
        native.reshape_and_cache(to_pd(k[:1]), to_pd(v[:1]), kc, vc, to_pd(np.array([nb * bs])))
