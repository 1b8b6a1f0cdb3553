"""linear vs references: numpy float64 for fp32 weights; the reference ops' fake quantization for
wint8/wint4 (the packed weights must equal it bit for bit); gguf's own dequantizer for GGUF blocks' operand (their int8-activation arithmetic: test_qgemm.py)."""

from __future__ import annotations

import numpy as np
import paddle
import pytest
from kernel_helpers import to_pd

SHAPES = [(1, 1, 1), (1, 576, 1536), (3, 37, 45), (13, 100, 33), (16, 64, 96), (31, 128, 70), (130, 576, 200)]


def _check(y, expect, x, w):
    # fp32 accumulation over K terms: error bound scales with sum |x||w| per output, stated as 1e-5 of it.
    bound = np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64).T
    np.testing.assert_array_less(np.abs(y - expect), 1e-5 * bound + 1e-6)


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_fp32_matches_numpy(native, rng, m, k, n, with_bias):
    w = rng.standard_normal((n, k), dtype=np.float32)
    b = rng.standard_normal(n, dtype=np.float32) if with_bias else None
    x = rng.standard_normal((m, k), dtype=np.float32)
    y = native.linear(to_pd(x), native.prepare_linear(w, b, None)).numpy()
    expect = x.astype(np.float64) @ w.astype(np.float64).T + (0 if b is None else b)
    assert y.shape == (m, n)
    _check(y, expect, x, w)


@pytest.mark.parametrize("quant", ["wint8", "wint4"])
# (64, 640, 70): enough rows for the K-blocked schedule, with K blocks (384 + 256) inside one scale group.
# (300, 832, 70): AVX2's scratch path in two row chunks and two K blocks (416 + 416, inside a wint4 group).
@pytest.mark.parametrize(
    "m,k,n", [(1, 576, 1536), (5, 128, 45), (16, 192, 96), (40, 64, 33), (64, 640, 70), (300, 832, 70)]
)
def test_weight_only_matches_reference(native, ref, rng, quant, m, k, n):
    w = rng.standard_normal((n, k), dtype=np.float32)
    w[3] = 0.0  # an all-zero row/group takes the scale-1 branch
    b = rng.standard_normal(n, dtype=np.float32)
    x = rng.standard_normal((m, k), dtype=np.float32)
    lw = native.prepare_linear(w, b, quant)
    rl = ref.prepare_linear(w, b, quant)
    np.testing.assert_array_equal(lw.dequantize(), rl.weight.numpy().T)  # same quantized operand
    y = native.linear(to_pd(x), lw).numpy()
    _check(y, ref.linear(to_pd(x), rl).numpy(), x, lw.dequantize())
    # What quantization costs against fp32 (stated, not a kernel tolerance): wint8 < 1%, wint4 < 15% rms.
    exact = x @ w.T + b
    rel = np.sqrt(np.mean((y - exact) ** 2) / np.mean(exact**2))
    assert rel < (0.01 if quant == "wint8" else 0.15)


def test_wint4_ragged_k_supported(native, rng):
    # The reference requires K % 64 == 0; the kernel also takes a ragged last group.
    w = rng.standard_normal((20, 100), dtype=np.float32)
    x = rng.standard_normal((3, 100), dtype=np.float32)
    lw = native.prepare_linear(w, None, "wint4")
    assert (
        np.abs(lw.dequantize() - w).max() <= np.abs(w).max() / 14 + 1e-6
    )  # half a step of the coarsest scale
    _check(native.linear(to_pd(x), lw).numpy(), x @ lw.dequantize().T, x, w)


GGUF_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "F16": 1, "F32": 0}


@pytest.mark.parametrize("name", list(GGUF_TYPES))
@pytest.mark.parametrize("m,k,n", [(1, 576, 100), (7, 64, 33), (33, 96, 64), (50, 800, 40)])
def test_gguf_blocks_match_gguf_dequantize(native, rng, name, m, k, n):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    qtype = GGMLQuantizationType[name]
    w = rng.standard_normal((n, k), dtype=np.float32)
    raw = (
        quantize(w, qtype)
        if name not in ("F16", "F32")
        else w.astype(np.float16 if name == "F16" else np.float32)
    )
    raw = np.ascontiguousarray(raw).view(np.uint8).reshape(n, -1)
    deq = dequantize(raw, qtype).reshape(n, k).astype(np.float32)
    b = rng.standard_normal(n, dtype=np.float32)
    lw = native.prepare_linear_gguf(raw, GGUF_TYPES[name], k, b)
    # Scales/mins are fp16 values held exactly in fp32; the kernel's fma(q, d, m) may differ from
    # gguf's d*q + m by one rounding, so compare the operand to 1 ulp of its magnitude.
    np.testing.assert_allclose(lw.dequantize(), deq, rtol=0, atol=np.abs(deq).max() * 2**-22)
    x = rng.standard_normal((m, k), dtype=np.float32)
    y = native.linear(to_pd(x), lw).numpy()
    if name in ("F16", "F32"):
        _check(y, x.astype(np.float64) @ deq.T + b, x, deq)
    else:  # block types multiply int8 activations (test_qgemm.py): their reference is the same arithmetic
        from fd_kernels import packing

        expect, mag = packing.qgemm_reference(x, lw.host)
        np.testing.assert_array_less(np.abs(y - expect), 1e-5 * mag + 1e-6)


def test_input_layouts(native, rng):
    w = rng.standard_normal((40, 24), dtype=np.float32)
    lw = native.prepare_linear(w, None, None)
    big = rng.standard_normal((5, 60), dtype=np.float32)
    view = to_pd(big)[:, 10:34]  # a strided column slice
    _check(native.linear(view, lw).numpy(), big[:, 10:34] @ w.T, big[:, 10:34], w)
    x3 = rng.standard_normal((2, 3, 24), dtype=np.float32)
    y3 = native.linear(to_pd(x3), lw).numpy()
    assert y3.shape == (2, 3, 40)
    _check(y3.reshape(6, 40), x3.reshape(6, 24) @ w.T, x3.reshape(6, 24), w)
    assert native.linear(paddle.zeros([0, 24]), lw).shape == [0, 40]


def test_bad_inputs_are_clear_errors(native, rng):
    w = rng.standard_normal((8, 16), dtype=np.float32)
    lw = native.prepare_linear(w, None, None)
    with pytest.raises(ValueError, match="16"):
        native.linear(paddle.zeros([2, 15]), lw)
    with pytest.raises(ValueError, match="quantization"):
        native.prepare_linear(w, None, "fp8")
    with pytest.raises(ValueError, match="bias"):
        native.prepare_linear(w, np.zeros(7, np.float32), None)
    with pytest.raises(ValueError, match="not supported"):
        native.prepare_linear_gguf(np.zeros((8, 16), np.uint8), 12, 16)
