"""Tiny ERNIE-4.5 checkpoints (dense and MoE) built with transformers once per session, and tests/ on
sys.path so `tiny_models` imports."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "2")  # before paddle is imported: it would default to 1
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pytest  # noqa: E402
import tiny_models  # noqa: E402

DENSE = "Ernie4_5ForCausalLM"
MOE = "Ernie4_5_MoeForCausalLM"
# Four layers: dense, MoE, dense, MoE (start 1, interval 2), so alternation is exercised. Eight experts,
# top-2, one shared expert. rope_theta 10000 (tiny_models' default) keeps rotary angles varied at the
# short positions tested.
MOE_OVERRIDES = dict(
    num_hidden_layers=4,
    moe_num_experts=8,
    moe_k=2,
    moe_intermediate_size=32,
    moe_num_shared_experts=1,
    moe_layer_start_index=1,
    moe_layer_end_index=-1,
    moe_layer_interval=2,
)
# Dense: untied LM head (lm_head.weight is stored, transposed in the Paddle layout); MoE: tied.
OVERRIDES = {DENSE: dict(head_dim=16, tie_word_embeddings=False), MOE: dict(MOE_OVERRIDES, head_dim=16)}


@pytest.fixture(scope="session")
def ernie_checkpoint(tmp_path_factory):
    """ernie_checkpoint(arch) -> folder with config.json, model.safetensors and a tiny tokenizer."""
    cache: dict[str, Path] = {}

    def build(arch: str) -> Path:
        if arch not in cache:
            folder = tmp_path_factory.mktemp(arch.lower())
            tiny_models.make_tiny_checkpoint(arch, folder, **OVERRIDES[arch])
            tiny_models.write_tiny_tokenizer(folder)
            cache[arch] = folder
        return cache[arch]

    return build


@pytest.fixture(scope="module", autouse=True)
def reference_ops():
    """Model tests compare the reference ops against transformers (the kernels have their own tests)."""
    from fdcli_engine import ops

    previous = ops.backend
    ops.use("reference")
    yield
    ops.use(previous)
