"""vLLM's embed_dtype / endianness of base64 pooling output: the bytes equal torch's cast of the same
float32 values (vLLM's tensor2binary: torch `.to(dtype)`, then a byteswap for the other byte order)."""

from __future__ import annotations

import base64
import sys

import numpy as np
import pytest
import torch

from fdcli_engine.pooling.encoding import encode_vector, to_bytes


def _values() -> np.ndarray:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(4096).astype(np.float32) * np.float32(3.0)
    # Exact halfway points of bfloat16 (ties go to even) and float16, and special values.
    ties = (np.arange(1, 65, dtype=np.uint32) << np.uint32(16)) | np.uint32(0x8000)
    ties = (ties + np.uint32(0x3F800000)).view(np.float32)
    special = np.array([0.0, -0.0, 1e-8, -1e-8, 65504.0, 7e4, np.inf, -np.inf, 1e38], dtype=np.float32)
    return np.concatenate([x, ties, special])


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("endianness", ["native", "little", "big"])
def test_bytes_equal_torch_cast(dtype, endianness):
    x = _values()
    t = torch.from_numpy(x).to(getattr(torch, dtype))
    view = {"float32": torch.int32, "float16": torch.int16, "bfloat16": torch.int16}[dtype]
    ref = t.view(view).numpy()
    if endianness not in ("native", sys.byteorder):
        ref = ref.byteswap()
    assert to_bytes(x, dtype, endianness) == ref.tobytes()


def test_float_output_ignores_embed_dtype_and_base64_defaults_to_openai_float32():
    x = _values()[:8].reshape(2, 4)
    assert encode_vector(x, "float", "float16") == x.tolist()
    raw = base64.b64decode(encode_vector(x, "base64"))
    np.testing.assert_array_equal(np.frombuffer(raw, dtype="<f4"), x.reshape(-1))


FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}  # vLLM's EMBED_DTYPE_TO_TORCH_DTYPE


def _fp8_probe(torch_dtype) -> np.ndarray:
    """Every fp8 value, the midpoints between neighbours (ties), one float32 ulp either side of both,
    values past the format's range, NaN and infinities of both signs, and random bit patterns."""
    every = torch.arange(256, dtype=torch.uint8).view(torch_dtype).float().numpy()
    finite = np.sort(every[np.isfinite(every)])
    mids = ((finite[:-1].astype(np.float64) + finite[1:]) / 2).astype(np.float32)
    bits = np.concatenate([finite, mids]).view(np.uint32)
    edges = np.array([448, 464, 470, 480, 1e4, 57344, 61439, 61440, 1e38, np.inf, np.nan, 1e-45], np.float32)
    rng = np.random.default_rng(1)
    random_bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    out = np.concatenate([every, mids, (bits + 1).view(np.float32), (bits - 1).view(np.float32), edges])
    return np.concatenate([out, -out, _values(), random_bits])


@pytest.mark.parametrize("dtype", list(FP8))
def test_fp8_bytes_equal_torch_cast(dtype):
    """vLLM's fp8 embed_dtypes: one byte a value, bit for bit torch's cast (round to nearest even;
    e4m3fn saturates at 448, e5m2 overflows to inf; NaN keeps its sign), whatever the endianness."""
    x = _fp8_probe(FP8[dtype])
    ref = torch.from_numpy(x.copy()).to(FP8[dtype]).view(torch.uint8).numpy().tobytes()
    for endianness in ("native", "little", "big"):
        assert to_bytes(x, dtype, endianness) == ref


@pytest.mark.parametrize(
    ("dtype", "mantissa_bits", "smallest"), [("fp8_e4m3", 3, 2.0**-9), ("fp8_e5m2", 2, 2.0**-16)]
)
def test_fp8_base64_decodes_back_within_the_formats_precision(dtype, mantissa_bits, smallest):
    rng = np.random.default_rng(2)
    x = rng.standard_normal(384).astype(np.float32) / np.float32(20)  # a normalized embedding's scale
    raw = base64.b64decode(encode_vector(x, "base64", dtype))
    back = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(FP8[dtype]).float().numpy()
    # Round to nearest: half an ulp, relative 2^-(m+1) for normals, half the smallest step below them.
    bound = np.maximum(np.abs(x) * 2.0 ** -(mantissa_bits + 1), smallest / 2)
    assert np.all(np.abs(back - x) <= bound)
    assert np.abs(back - x).max() > 0  # the values were really cut to fp8
