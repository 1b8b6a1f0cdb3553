"""The emulation behind benchmarks/int8_activation_accuracy.py is faithful: its GGUF block parser gives
the kernel's own dequantized weights, its bf16 path is what fd's AMX prompt rows compute (within the
kernel's fp32-summation bound of test_amx.py), and its AMX-INT8 path (integer block sums, float32 block
scales) is the float product of the rounded activations and the weights, within its stated rounding
bound of half an activation step per element."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from kernel_helpers import to_pd, to_rows

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import int8_emulation as emu  # noqa: E402

SHAPES = [(5, 96, 70), (40, 576, 200), (70, 1536, 64)]


def _blocks(rng, qtype: int, n: int, k: int):
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    w = rng.standard_normal((n, k), dtype=np.float32) * 0.05
    raw = np.ascontiguousarray(quantize(w, GGMLQuantizationType(qtype))).view(np.uint8).reshape(n, -1)
    return raw, emu.parse_blocks(raw, qtype, n, k)


def _activations(rng, m: int, k: int) -> np.ndarray:
    x = rng.standard_normal((m, k), dtype=np.float32) * rng.uniform(0.1, 10, (m, 1)).astype(np.float32)
    x[:, 7] *= 40  # an outlier channel, as real post-norm activations have
    return x


@pytest.mark.parametrize("qtype", [emu.Q4_1, emu.Q8_0])
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_bf16_path_is_the_bf16_prompt_rows(native, rng, qtype, m, k, n):
    if native.active_isa() not in native.BF16_PROMPT_ISAS:
        pytest.skip("the CPU (or FD_KERNELS_ISA) selects no bf16 prompt-row level (AMX or AVX512-BF16)")
    raw, (codes, d, mins) = _blocks(rng, qtype, n, k)
    lw = native.prepare_linear_gguf(raw, qtype, k)
    w = emu.dequantize(codes, d, mins)
    np.testing.assert_array_equal(lw.dequantize(), w)
    x = _activations(rng, m, k)
    y = native.linear(to_pd(x), lw, to_rows(np.ones(m, dtype=bool))).numpy()
    bound = np.abs(emu.bf16(x)).astype(np.float64) @ np.abs(emu.bf16(w)).astype(np.float64).T
    np.testing.assert_array_less(np.abs(y - emu.bf16_path(x, w)), 1e-5 * bound + 1e-6)


@pytest.mark.parametrize("qtype", [emu.Q4_1, emu.Q8_0])
@pytest.mark.parametrize("mode", ["row", "block", "block16"])
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_int8_path_is_the_rounded_activations_product(rng, qtype, mode, m, k, n):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    raw, (codes, d, mins) = _blocks(rng, qtype, n, k)
    w = emu.dequantize(codes, d, mins)
    np.testing.assert_array_equal(w, dequantize(raw, GGMLQuantizationType(qtype)).reshape(n, k))
    x = _activations(rng, m, k)
    y = emu.int8_path(x, codes, d, mins, mode)
    w64 = w.astype(np.float64)
    xq = emu.fake_quant(x, mode).astype(np.float64)
    mag = np.abs(xq) @ np.abs(w64).T
    np.testing.assert_array_less(np.abs(y - xq @ w64.T), 2e-6 * mag + 1e-6)
    # Against the float activations: at most half a step per element, per block's step.
    _, s = emu.quantize_int8(x, mode)
    wsum = np.abs(w64).reshape(n, -1, emu.QK).sum(axis=2)
    err = np.abs(y - x.astype(np.float64) @ w64.T)
    np.testing.assert_array_less(err, (s / 2) @ wsum.T * (1 + 1e-3) + 2e-6 * mag + 1e-6)
    # ... and the rounding is really there (int8 steps), or the codes really take 16 bits ("block16").
    if mode == "block16":
        assert np.abs(emu.quantize_int8(x, mode)[0]).max() > 127 * 255
    else:
        assert err.max() > 1e-3 * np.abs(y).max()
