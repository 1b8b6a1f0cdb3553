"""The tiny ERNIE MoE through the C++ kernels (the production path): fp32 logits against
transformers, and wint8/wint4 logits against the same quantization simulated by the reference ops
(the kernels reproduce the quantized weights exactly; only summation order differs).

Tolerances: atol 1e-3 on logits of magnitude ~5 (the native GEMM and attention sum in a different
order than torch and than the reference; observed differences are ~1e-5)."""

from __future__ import annotations

import numpy as np
import pytest
from ernie_archs import MOE
from test_ernie_models import PROMPT, build_fd, hf_logits
from tiny_models import PagedRunner, load_hf_model

from fdcli_engine import ops

ATOL = 1e-3


@pytest.fixture(scope="module")
def native_ops(reference_ops):
    try:
        ops.use("native")
    except RuntimeError as exc:
        pytest.skip(f"C++ kernels unavailable: {exc}")
    yield
    ops.use("reference")


def logits_for(folder, quantization, backend):
    ops.use(backend)
    runner = PagedRunner(build_fd(folder, MOE, quantization=quantization))
    first = runner.step([("s", PROMPT)])
    return np.concatenate([first, runner.step([("s", [8])]), runner.step([("s", [300])])])


def test_native_moe_matches_transformers(native_ops, ernie_checkpoint):
    folder = ernie_checkpoint(MOE)
    assert ops.backend == "native"
    got = PagedRunner(build_fd(folder, MOE)).step([("s", PROMPT)])
    np.testing.assert_allclose(got, hf_logits(load_hf_model(folder), PROMPT), atol=ATOL, rtol=0)


@pytest.mark.parametrize("quant", ["wint8", "wint4"])
def test_native_quantized_moe_matches_reference_simulation(native_ops, ernie_checkpoint, quant):
    folder = ernie_checkpoint(MOE)
    ref = logits_for(folder, quant, "reference")
    got = logits_for(folder, quant, "native")
    np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)
