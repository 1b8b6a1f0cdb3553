"""The C8 row rule as KV offload's int8 tier runs it (fd_kernels.native.kv_s8): codes and scales bit-equal
to the reference's quantize_kv_s8, the C8 cache's rule, and a restore bit-equal to codes * scale in fp32,
over head sizes that take the vector body and the scalar tail, all-zero rows and extreme values.
test_isa.py re-runs this file under every lower ISA path."""

from __future__ import annotations

import numpy as np
import paddle
import pytest


def rows(rng, shape) -> np.ndarray:
    x = (rng.standard_normal(shape) * rng.choice([1e-3, 1.0, 1e3, 1e30, 0.0], shape[:-1])[..., None]).astype(
        np.float32
    )
    x[0, 0] = 0.0  # an all-zero row: scale 1, codes 0
    x[0, 1, 0] = np.float32(3.4e38)  # near fp32's max
    x[-1, -1, : shape[-1] // 2] = -x[-1, -1, shape[-1] // 2 :][: shape[-1] // 2]  # ties of |x|
    return x


@pytest.fixture(scope="module")
def kv_s8(native):
    from fd_kernels.native import kv_s8

    return kv_s8


@pytest.mark.parametrize("hd", [64, 128, 16, 8, 13])
def test_quantize_matches_the_c8_rule_and_restores_exactly(kv_s8, ref, rng, hd):
    x = rows(rng, (6, 5, hd))
    codes, scales = np.full(x.shape, 99, np.int8), np.full(x.shape[:-1], np.nan, np.float32)
    kv_s8.kv_s8_quantize(x, codes, scales)
    want_q, want_s = ref.quantize_kv_s8(paddle.to_tensor(x))
    assert np.array_equal(codes, want_q.numpy()) and np.array_equal(scales, want_s.numpy())
    out = np.full(x.shape, np.nan, np.float32)
    kv_s8.kv_s8_dequantize(codes, scales, out)
    assert np.array_equal(out, codes.astype(np.float32) * scales[..., None])
    assert np.all(np.abs(out - x) <= scales[..., None] / 2 * (1 + 1e-6))  # the C8 cache's error bound


@pytest.mark.parametrize("hd", [64, 13])
def test_bf16_rows_widen_exactly_and_restore_rounded_like_the_bf16_cache(kv_s8, ref, rng, hd):
    bits = (rows(rng, (4, 3, hd)).view(np.uint32) >> 16).astype(np.uint16)
    x = (bits.astype(np.uint32) << 16).view(np.float32)
    codes, scales = np.empty(bits.shape, np.int8), np.empty(bits.shape[:-1], np.float32)
    kv_s8.kv_s8_quantize(bits, codes, scales)
    want_q, want_s = ref.quantize_kv_s8(paddle.to_tensor(x))
    assert np.array_equal(codes, want_q.numpy()) and np.array_equal(scales, want_s.numpy())
    out = np.empty(bits.shape, np.uint16)
    kv_s8.kv_s8_dequantize(codes, scales, out)
    want = ref.round_bf16(paddle.to_tensor(codes.astype(np.float32) * scales[..., None]))
    assert np.array_equal(out, want.view("uint16").numpy())


def test_writes_into_a_view_and_refuses_bad_arrays(kv_s8, rng):
    x = rows(rng, (2, 3, 16))
    pool = np.zeros((4, 2, 3, 16), np.float32)
    codes, scales = np.empty(x.shape, np.int8), np.empty(x.shape[:-1], np.float32)
    kv_s8.kv_s8_quantize(x, codes, scales)
    kv_s8.kv_s8_dequantize(codes, scales, pool[2])  # a pool block's view: the rest untouched
    assert np.array_equal(pool[2], codes.astype(np.float32) * scales[..., None])
    assert not pool[[0, 1, 3]].any()
    with pytest.raises(ValueError, match="contiguous"):
        kv_s8.kv_s8_dequantize(codes, scales, pool[:, 0])  # not contiguous
    with pytest.raises(ValueError, match="int8"):
        kv_s8.kv_s8_quantize(x, codes.view(np.uint8), scales)
    with pytest.raises(ValueError, match="shape"):
        kv_s8.kv_s8_quantize(x, codes, scales[:1])
