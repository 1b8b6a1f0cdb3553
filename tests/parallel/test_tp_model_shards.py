"""Whole models sharded over 2 ranks (threads of this process, tp_threads.py) against the unsharded model
on the same checkpoint: logits of a batched prefill then decode steps over a paged KV cache.

Tolerance: fp32, |TP=2 - TP=1| <= 1e-4 x max|logit| (the sums of the partial products run in another
order; the greedy tokens are asserted equal as well)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from tp_threads import build_ranks, run_ranks

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ernie"))
import tiny_models  # noqa: E402
from ernie_archs import MOE, OVERRIDES  # noqa: E402

LOGIT_TOL = 1e-4
CASES = {
    "llama": ("LlamaForCausalLM", {}, {}),
    "qwen2": ("Qwen2ForCausalLM", {}, {}),
    "qwen3": ("Qwen3ForCausalLM", {}, {}),
    "ernie": ("Ernie4_5ForCausalLM", OVERRIDES["Ernie4_5ForCausalLM"], {}),
    "ernie-moe": (MOE, OVERRIDES[MOE], {}),
    "ernie-moe-ep": (MOE, OVERRIDES[MOE], {"enable_expert_parallel": True}),
    "llama-wint8": ("LlamaForCausalLM", {}, {"quantization": "wint8"}),
}


def _steps(model):
    """Logits of: a 2-sequence prefill (7 and 4 tokens), then 3 batched decode steps."""
    runner = tiny_models.PagedRunner(model, num_blocks=32, block_size=4)
    out = [runner.step([("a", [3, 17, 99, 250, 7, 8, 400]), ("b", [11, 12, 13, 14])])]
    for t in range(3):
        out.append(runner.step([("a", [20 + t]), ("b", [30 + t])]))
    return np.concatenate(out)


@pytest.mark.parametrize("case", list(CASES))
def test_tp2_logits_equal_tp1(case, tmp_path):
    from fdcli_engine.config import EngineConfig
    from fdcli_engine.config_resolver import resolve_config
    from fdcli_engine.loader import load_model

    arch, overrides, options = CASES[case]
    folder = tiny_models.make_tiny_checkpoint(arch, tmp_path, **overrides)
    config = resolve_config(EngineConfig(model=str(folder), quantization=options.get("quantization")))
    config = config.replace(enable_expert_parallel=options.get("enable_expert_parallel", False))
    (ref,) = build_ranks(1, lambda: load_model(config))
    ranks = build_ranks(2, lambda: load_model(config))
    assert ranks[0].num_kv_heads == ref.num_kv_heads // 2
    if options.get("enable_expert_parallel"):  # rank r holds whole experts 4r..4r+3 of each MoE layer
        moe = [layer.mlp for layer in ranks[1].layers if hasattr(layer.mlp, "local_experts")]
        assert moe and all(list(m.local_experts) == [4, 5, 6, 7] for m in moe)
        assert all(m.experts[0] is None for m in moe)
    want = _steps(ref)
    got = run_ranks([lambda m=m: _steps(m) for m in ranks])
    np.testing.assert_array_equal(got[0], got[1])
    np.testing.assert_allclose(got[0], want, rtol=0, atol=LOGIT_TOL * np.abs(want).max())
    assert (got[0].argmax(-1) == want.argmax(-1)).all()
