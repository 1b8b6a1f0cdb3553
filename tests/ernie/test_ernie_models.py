"""fd's ERNIE-4.5 dense and MoE models against transformers on tiny random checkpoints, through the
paged KV cache (block_size 4, scattered block ids), fp32, reference ops.

Tolerance: logits within atol 1e-4 (fp32 summation order differs between Paddle and torch; observed
about 1e-6 on logits of magnitude ~5), greedy tokens identical. The MoE checkpoint has a random
correction bias and random router, so routing differs per token and the bias changes selections.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ernie_archs import DENSE, MOE
from tiny_models import PagedRunner, load_hf_model

from fdcli_engine.config import EngineConfig
from fdcli_engine.loader import read_model_config
from fdcli_engine.loader.hf import iter_hf_weights
from fdcli_engine.models.ernie4_5 import Ernie4_5ForCausalLM, interleaved_to_neox_rows
from fdcli_engine.models.ernie4_5_moe import Ernie4_5_MoeForCausalLM, moe_layer_ids

ATOL = 1e-4
PROMPT = [5, 17, 42, 99, 3, 250, 7, 128, 64, 311]
CLASSES = {DENSE: Ernie4_5ForCausalLM, MOE: Ernie4_5_MoeForCausalLM}


def build_fd(folder, arch, quantization=None, weights=None):
    model = CLASSES[arch](
        read_model_config(folder), EngineConfig(model=str(folder), quantization=quantization)
    )
    model.load_weights(weights if weights is not None else iter_hf_weights(folder))
    return model


def hf_logits(hf_model, token_ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return hf_model(torch.tensor([token_ids])).logits[0].numpy()


def hf_greedy(hf_model, prompt: list[int], n: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(int(hf_logits(hf_model, tokens)[-1].argmax()))
    return tokens[len(prompt) :]


@pytest.fixture(scope="module", params=[DENSE, MOE], ids=["dense", "moe"])
def models(request, ernie_checkpoint):
    folder = ernie_checkpoint(request.param)
    return build_fd(folder, request.param), load_hf_model(folder)


def test_moe_layers_alternate(ernie_checkpoint):
    model = build_fd(ernie_checkpoint(MOE), MOE)
    assert model.moe_layer_ids == [1, 3]
    assert moe_layer_ids(
        {"moe_layer_start_index": 1, "moe_layer_end_index": 2, "moe_layer_interval": 1}, 4
    ) == [1, 2]
    hf = load_hf_model(ernie_checkpoint(MOE))
    hf_moe = [i for i, layer in enumerate(hf.model.layers) if hasattr(layer.mlp, "gate")]
    assert hf_moe == model.moe_layer_ids


def test_prefill_then_decode_logits_match(models):
    fd_model, hf_model = models
    runner = PagedRunner(fd_model, block_size=4)
    tokens = list(PROMPT)
    got = runner.step([("s", tokens)])
    np.testing.assert_allclose(got, hf_logits(hf_model, tokens), atol=ATOL, rtol=0)
    for next_token in [8, 300, 21, 77, 4, 500]:  # decode across block boundaries
        tokens.append(next_token)
        got = runner.step([("s", [next_token])])
        np.testing.assert_allclose(got[0], hf_logits(hf_model, tokens)[-1], atol=ATOL, rtol=0)


def test_greedy_32_tokens_identical(models):
    fd_model, hf_model = models
    got = PagedRunner(fd_model, block_size=4).greedy("s", PROMPT, 32)
    assert got == hf_greedy(hf_model, PROMPT, 32)


def test_batched_equals_solo(models):
    fd_model, _ = models
    prompts = {"a": PROMPT, "b": [9, 8, 7], "c": list(range(20, 45))}
    solo = {k: PagedRunner(fd_model, block_size=4).step([(k, p)]) for k, p in prompts.items()}
    batched = PagedRunner(fd_model, block_size=4, seed=3).step(list(prompts.items()))
    start = 0
    for k, p in prompts.items():
        np.testing.assert_allclose(batched[start : start + len(p)], solo[k], atol=1e-5, rtol=0)
        start += len(p)


def test_interleaved_to_neox_permutation_is_a_rotary_identity():
    """Hand check of the load-time trick: GPT-J rotary on x equals NeoX rotary on permuted x,
    permuted back."""
    rng = np.random.default_rng(0)
    hd, pos, theta = 8, 5, 10000.0
    x = rng.standard_normal(hd)
    ang = pos * theta ** (-np.arange(0, hd, 2) / hd)
    gptj = x.copy()
    gptj[0::2] = x[0::2] * np.cos(ang) - x[1::2] * np.sin(ang)
    gptj[1::2] = x[1::2] * np.cos(ang) + x[0::2] * np.sin(ang)
    p = interleaved_to_neox_rows(x[:, None], 1)[:, 0]
    half = hd // 2
    neox = np.concatenate(
        [p[:half] * np.cos(ang) - p[half:] * np.sin(ang), p[half:] * np.cos(ang) + p[:half] * np.sin(ang)]
    )
    np.testing.assert_allclose(neox, interleaved_to_neox_rows(gptj[:, None], 1)[:, 0], atol=1e-12)


@pytest.mark.parametrize(
    "arch,change,message",
    [
        (DENSE, {"use_bias": True}, "use_bias=true is not supported"),
        (MOE, {"moe_num_experts": [8, 8]}, "moe_num_experts must be an integer"),
        (MOE, {"moe_layer_interval": 0}, "moe_layer_interval must be at least 1"),
    ],
)
def test_unsupported_configs_are_clear_errors(ernie_checkpoint, arch, change, message):
    from fdcli_engine.errors import ModelLoadError

    cfg = read_model_config(ernie_checkpoint(arch), hf_overrides=change)
    with pytest.raises(ModelLoadError, match=message):
        CLASSES[arch](cfg, EngineConfig(quantization=None))


def test_no_correction_bias_needed_without_aux_free_routing(ernie_checkpoint):
    """moe_use_aux_free: false (no moe_statics in the checkpoint) loads with a zero bias; otherwise a
    missing bias is a load error, not silently zero."""
    from fdcli_engine.errors import ModelLoadError

    folder = ernie_checkpoint(MOE)
    weights = [(n, w) for n, w in iter_hf_weights(folder) if "moe_statics" not in n]
    cfg = read_model_config(folder)
    with pytest.raises(ModelLoadError, match="moe_statics"):
        Ernie4_5_MoeForCausalLM(cfg, EngineConfig(quantization=None)).load_weights(iter(weights))
    model = Ernie4_5_MoeForCausalLM({**cfg, "moe_use_aux_free": False}, EngineConfig(quantization=None))
    model.load_weights(iter(weights))
    assert not model.layers[1].mlp.correction_bias.value.any()
