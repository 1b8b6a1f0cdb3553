"""The GGUF-native linear on SmolLM2-135M's real tensors (Q4_1 projections, the Q8_0 embedding that is
also the tied LM head): the kernel against its int8-activation arithmetic in numpy, and within the stated
activation-rounding bound of gguf's dequantizer followed by an fp64 matmul."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import to_pd

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reader():
    import gguf

    from fdcli_engine.config import default_model_path

    path = default_model_path()
    if not path or not __import__("os").path.exists(path):
        pytest.skip("SmolLM2 GGUF not installed")
    return gguf.GGUFReader(path)


@pytest.mark.parametrize(
    "name,rows", [("blk.0.ffn_down.weight", None), ("blk.3.attn_q.weight", None), ("token_embd.weight", 3000)]
)
def test_real_tensor(native, reader, rng, name, rows):
    from fd_kernels import packing
    from gguf.quants import dequantize

    t = next(t for t in reader.tensors if t.name == name)
    raw = np.asarray(t.data)[:rows]
    in_features = int(t.shape[0])
    deq = dequantize(raw, t.tensor_type).reshape(raw.shape[0], in_features).astype(np.float64)
    lw = native.prepare_linear_gguf(raw, int(t.tensor_type), in_features)
    np.testing.assert_allclose(lw.dequantize(), deq, rtol=0, atol=np.abs(deq).max() * 2**-22)
    x = rng.standard_normal((5, in_features), dtype=np.float32)
    y = native.linear(to_pd(x), lw).numpy()
    expect, mag = packing.qgemm_reference(x, lw.host)
    np.testing.assert_array_less(np.abs(y - expect), 1e-5 * mag + 1e-6)
    # The stated tolerance against the dequantized fp32 matmul: half an activation step per element.
    step = np.abs(x.reshape(5, -1, 32)).max(axis=2) / 127
    bound = (step / 2) @ np.abs(deq).reshape(deq.shape[0], -1, 32).sum(axis=2).T
    np.testing.assert_array_less(
        np.abs(y - x @ deq.T), bound * (1 + 1e-3) + 1e-5 * (np.abs(x) @ np.abs(deq).T)
    )
