"""The GGUF block kernel (csrc/qgemm_impl.h): Q4_0 / Q4_1 / Q8_0 weights times 16-bit fixed-point
activations (two int8 planes on the VNNI units).

Oracle: `packing.qgemm_reference`, the kernel's arithmetic in numpy (the same integer activations, exact
integer block sums, the same float32 factors), summed in float64; the kernel may differ only by its fp32
accumulation, bounded by 1e-5 of the sum of the terms' magnitudes. Against the dequantized fp32 matmul the
stated tolerance is what the fixed-point activations cost: each moves by at most half its block's step
da = max|x| / (127 * 256), so |y - x @ W^T| <= sum over blocks of da / 2 * sum |w| (plus fp32 rounding).
test_isa.py re-runs this file on the AVX2 and scalar paths; test_the_expected_path_runs says which one a
run checks (VNNI only where the CPU has it)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from isa_levels import cpu_flags
from kernel_helpers import to_pd

TYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8}
# Row counts around the kernel's row blocks (at most 4 rows, 6 on AVX2; 1 row takes its own items), N around its
# 16-column panels, K from one block up.
SHAPES = [
    (1, 32, 1),
    (1, 576, 100),
    (2, 64, 33),
    (3, 96, 16),
    (4, 64, 40),
    (7, 64, 47),
    (16, 576, 200),
    (50, 800, 40),
]


def _gguf_weight(native, rng, name, n, k, with_bias=True):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    qtype = GGMLQuantizationType[name]
    w = rng.standard_normal((n, k), dtype=np.float32)
    w[min(2, n - 1), :32] = 0.0  # an all-zero block: d = 0
    raw = np.ascontiguousarray(quantize(w, qtype)).view(np.uint8).reshape(n, -1)
    b = rng.standard_normal(n, dtype=np.float32) if with_bias else None
    lw = native.prepare_linear_gguf(raw, TYPES[name], k, b)
    deq = dequantize(raw, qtype).reshape(n, k).astype(np.float64)
    return lw, deq, b


def _check_reference(y, x, lw):
    from fd_kernels import packing

    expect, mag = packing.qgemm_reference(x, lw.host)
    np.testing.assert_array_less(np.abs(y - expect), 1e-5 * mag + 1e-6)


@pytest.mark.parametrize("name", list(TYPES))
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_matches_int8_activation_reference(native, rng, name, m, k, n):
    lw, deq, b = _gguf_weight(native, rng, name, n, k)
    x = rng.standard_normal((m, k), dtype=np.float32) * rng.uniform(0.1, 10, (m, 1)).astype(np.float32)
    x[0, :32] = 0.0  # an all-zero activation block: q = 0, d = 0
    y = native.linear(to_pd(x), lw).numpy()
    assert y.shape == (m, n)
    _check_reference(y, x, lw)
    # The stated tolerance against the dequantized weights in float64.
    step = np.abs(x.reshape(m, -1, 32)).max(axis=2) / (127 * 256)  # da per (row, block)
    wsum = np.abs(deq).reshape(n, -1, 32).sum(axis=2)  # sum |w| per (column, block)
    bound = (step / 2) @ wsum.T * 1.05 + 1e-5 * (np.abs(x) @ np.abs(deq).T) + 1e-5
    exact = x.astype(np.float64) @ deq.T + b
    np.testing.assert_array_less(np.abs(y - exact), bound)


@pytest.mark.parametrize("name", list(TYPES))
def test_a_row_does_not_depend_on_its_batch(native, rng, name):
    lw, _, _ = _gguf_weight(native, rng, name, 70, 192)
    x = rng.standard_normal((50, 192), dtype=np.float32)
    batch = native.linear(to_pd(x), lw).numpy()
    for i in (0, 1, 17, 49):
        np.testing.assert_array_equal(native.linear(to_pd(x[i : i + 1]), lw).numpy()[0], batch[i])
    np.testing.assert_array_equal(native.linear(to_pd(x[10:26]), lw).numpy(), batch[10:26])


def test_without_bias_and_strided_input(native, rng):
    lw, _, _ = _gguf_weight(native, rng, "Q4_1", 40, 64, with_bias=False)
    big = rng.standard_normal((5, 100), dtype=np.float32)
    y = native.linear(to_pd(big)[:, 20:84], lw).numpy()
    _check_reference(y, big[:, 20:84], lw)


def test_activation_quantization_matches_definition():
    from fd_kernels import packing

    x = np.array([np.linspace(-3, 3, 64, dtype=np.float32), np.zeros(64, np.float32)])
    q, da, s, sq = packing.quantize_activations(x)
    np.testing.assert_array_equal(da[0], np.float32(3) / np.float32(127) / np.float32(256))  # |x| reaches 3
    assert q[0, 0] == -127 * 256 and q[0, 63] == 127 * 256 and (q[1] == 0).all() and (da[1] == 0).all()
    np.testing.assert_array_equal(sq, q.reshape(2, 2, 32).sum(axis=2))
    np.testing.assert_allclose(s, da * sq, rtol=1e-7)
    err = np.abs(q.reshape(2, 2, 32) * da[..., None].astype(np.float64) - x.reshape(2, 2, 32))
    assert err.max() <= da.max() / 2 * 1.01


def test_codes_split_into_two_signed_bytes(native, rng):
    """Q = 256 * hi + lo must survive every value, e.g. -1 (hi = -1, lo = -1) and -128 / 127 in lo:
    a weight of one code against activations that hit those fixed-point values exactly."""
    from fd_kernels import packing
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    w = np.ones((16, 32), dtype=np.float32)
    raw = np.ascontiguousarray(quantize(w, GGMLQuantizationType.Q8_0)).view(np.uint8).reshape(16, -1)
    lw = native.prepare_linear_gguf(raw, 8, 32)
    # amax 127 -> d = 1, Q = rint(256 x): x = q / 256 for chosen q.
    qs = np.array([-1, -128, 127, 128, -129, 255, -256, 32512, -32512, 1, 0, 383] + [0] * 19 + [32512])
    x = (qs / 256).astype(np.float32)[None, :]
    got = native.linear(to_pd(x), lw).numpy()
    q, *_ = packing.quantize_activations(x)
    np.testing.assert_array_equal(q[0], qs)
    # x is exactly representable: the result is the exact product (fp16 d = 1/127 is not exactly 1/127).
    np.testing.assert_allclose(got[0], lw.dequantize().astype(np.float64) @ x[0], rtol=1e-6)


def test_rejects_partial_blocks(native):
    with pytest.raises(ValueError):
        native.prepare_linear_gguf(np.zeros((4, 10), np.uint8), 3, 16)


@pytest.mark.parametrize("name", list(TYPES))
def test_embedding_rows_equal_gguf_dequantize(native, ref, rng, name):
    """A token embedding read from the blocks equals gguf's dequantized row bit for bit, natively and in
    the reference; ids outside the table are a clear error."""
    import paddle
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    n, k = 70, 96
    w = rng.standard_normal((n, k), dtype=np.float32)
    raw = np.ascontiguousarray(quantize(w, GGMLQuantizationType[name])).view(np.uint8).reshape(n, -1)
    deq = dequantize(raw, GGMLQuantizationType[name]).reshape(n, k).astype(np.float32)
    ids = np.array([[0, 69, 17], [16, 15, 33]], dtype=np.int64)
    got = native.embedding(paddle.to_tensor(ids), native.prepare_linear_gguf(raw, TYPES[name], k)).numpy()
    np.testing.assert_array_equal(got, deq[ids])
    want = ref.embedding(paddle.to_tensor(ids), ref.prepare_linear_gguf(raw, TYPES[name], k)).numpy()
    np.testing.assert_array_equal(want, deq[ids])
    # A prompt's worth of ids (>= 2^16 values): the rows are split over the threads.
    many = rng.integers(0, n, size=700)
    got = native.embedding(paddle.to_tensor(many), native.prepare_linear_gguf(raw, TYPES[name], k)).numpy()
    np.testing.assert_array_equal(got, deq[many])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        native.embedding(paddle.to_tensor(np.array([70])), native.prepare_linear_gguf(raw, TYPES[name], k))


def _expected_path() -> str:
    flags, forced = cpu_flags(), os.environ.get("FD_KERNELS_ISA")
    avx2 = {"avx2", "fma"} <= flags
    vnni = avx2 and {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"} <= flags
    if forced == "scalar" or not avx2:
        return "scalar"
    return "avx512vnni" if vnni and forced != "avx2" else "avx2"


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="needs /proc/cpuinfo to know the CPU")
def test_the_expected_path_runs(native):
    """The instantiation under test is the one the CPU and FD_KERNELS_ISA call for, so the default run and
    test_isa.py's re-runs check the VNNI (where the CPU has it), AVX2 and scalar paths each."""
    assert native.qgemm_path() == _expected_path()


@pytest.mark.parametrize("name", list(TYPES))
@pytest.mark.parametrize("m", [5, 16, 17])
def test_rows_of_a_verify_call_equal_decode_rows(native, rng, name, m):
    """Speculative decoding verifies k + 1 rows per request in one call: each row must get exactly the bits
    its own one-row decode call gets, wherever it sits (m = 5, 16, 17 cover the row blocks of every path;
    16 is a batch-16 decode step's)."""
    lw, _, _ = _gguf_weight(native, rng, name, 100, 576)
    x = rng.standard_normal((m, 576), dtype=np.float32)
    batch = native.linear(to_pd(x), lw).numpy()
    for r in range(m):
        np.testing.assert_array_equal(
            batch[r], native.linear(to_pd(x[r : r + 1]), lw).numpy()[0], err_msg=f"row {r}"
        )
    # The same row at another position of another batch.
    moved = native.linear(to_pd(np.roll(x, 3, axis=0)), lw).numpy()
    np.testing.assert_array_equal(moved, np.roll(batch, 3, axis=0))


def test_extreme_codes_times_extreme_activations_are_exact(native):
    """Q8_0 codes -128 and 127 against activations at full scale (Q = +-32512): the products a 16-bit
    pair sum (vpmaddubsw) would saturate. Every value here is an integer, so the result is exact."""
    import struct

    k, codes = 64, np.zeros((16, 64), np.int8)
    codes[0], codes[1] = -128, 127
    codes[2, ::2], codes[2, 1::2] = -128, 127
    codes[3] = np.tile(np.arange(-128, 128, 8), 2)
    codes[4:] = np.random.default_rng(7).integers(-128, 128, (12, k))
    one = struct.pack("<e", 1.0)
    raw = np.frombuffer(
        b"".join(one + codes[c, b * 32 : (b + 1) * 32].tobytes() for c in range(16) for b in range(2)),
        np.uint8,
    ).reshape(16, -1)
    lw = native.prepare_linear_gguf(raw, TYPES["Q8_0"], k)
    x = np.full((4, k), 127, np.float32)  # max|x| = 127: d = 1, Q = 256 x = 32512
    x[1] = -127
    x[2, ::2] = -127
    x[3, :32], x[3, 32:] = -127, 127
    got = native.linear(to_pd(x), lw).numpy()
    np.testing.assert_array_equal(got, x.astype(np.float64) @ codes.T.astype(np.float64))
