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
