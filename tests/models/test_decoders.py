"""fd's Llama/Qwen2/Qwen3 against transformers on tiny random checkpoints, through the paged KV cache
(block_size 4, scattered block ids), in fp32.

Tolerance: logits within atol 1e-4 (observed ~6e-6 on logits of magnitude ~5; fp32 summation order
differs between Paddle and torch), greedy tokens identical.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_models import ARCHITECTURES, PagedRunner, load_fd_model, load_hf_model

ATOL = 1e-4
PROMPT = [5, 17, 42, 99, 3, 250, 7, 128, 64, 311]
CASES = [(arch, {}) for arch in ARCHITECTURES] + [
    # Tied head + Llama 3.1 rope scaling with a short original context so all three frequency bands
    # (kept, scaled, blended) occur at head_dim 16.
    (
        "LlamaForCausalLM",
        {
            "tie_word_embeddings": True,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
    ),
]
IDS = ["llama", "qwen2", "qwen3", "llama-tied-llama3rope"]


def hf_logits(hf_model, token_ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return hf_model(torch.tensor([token_ids])).logits[0].numpy()


@pytest.fixture(params=list(zip(CASES, IDS, strict=True)), ids=IDS)
def models(request, tiny_checkpoint):
    (arch, overrides), _ = request.param
    folder = tiny_checkpoint(arch, **overrides)
    return load_fd_model(folder), load_hf_model(folder)


def test_prefill_then_decode_logits_match(models):
    fd_model, hf_model = models
    runner = PagedRunner(fd_model, block_size=4)
    tokens = list(PROMPT)
    got = runner.step([("s", tokens)])
    np.testing.assert_allclose(got, hf_logits(hf_model, tokens), atol=ATOL, rtol=0)
    # Decode steps cross block boundaries (positions 10..15 with block_size 4).
    for next_token in [8, 300, 21, 77, 4, 500]:
        tokens.append(next_token)
        got = runner.step([("s", [next_token])])
        np.testing.assert_allclose(got[0], hf_logits(hf_model, tokens)[-1], atol=ATOL, rtol=0)


def test_greedy_32_tokens_match(models):
    fd_model, hf_model = models
    # The reference recomputes the whole sequence each step (no HF cache), so it shares no state logic.
    expected, seq = [], list(PROMPT)
    for _ in range(32):
        expected.append(int(hf_logits(hf_model, seq)[-1].argmax()))
        seq.append(expected[-1])
    got = PagedRunner(fd_model, block_size=4).greedy("s", PROMPT, 32)
    assert got == expected
    assert len(set(got)) > 3  # a degenerate model would make the comparison meaningless


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen3ForCausalLM"])
def test_mixed_varlen_batch(arch, tiny_checkpoint):
    """One step holding a fresh prefill, a decode token and a prefill chunk over a cached prefix."""
    folder = tiny_checkpoint(arch)
    fd_model, hf_model = load_fd_model(folder), load_hf_model(folder)
    seq_a, seq_b, seq_c = PROMPT, [9, 8, 7, 6, 5, 4, 3, 2], [100, 200, 300, 400, 11, 22, 33, 44, 55, 66, 77]
    runner = PagedRunner(fd_model, block_size=4)
    first = runner.step([("b", seq_b[:7]), ("c", seq_c[:6])])  # two prefills batched
    np.testing.assert_allclose(first[:7], hf_logits(hf_model, seq_b[:7]), atol=ATOL, rtol=0)
    np.testing.assert_allclose(first[7:], hf_logits(hf_model, seq_c[:6]), atol=ATOL, rtol=0)
    got = runner.step([("a", seq_a), ("b", seq_b[7:]), ("c", seq_c[6:])])
    assert got.shape == (len(seq_a) + 1 + 5, fd_model.vocab_size)
    np.testing.assert_allclose(got[:10], hf_logits(hf_model, seq_a), atol=ATOL, rtol=0)
    np.testing.assert_allclose(got[10], hf_logits(hf_model, seq_b)[-1], atol=ATOL, rtol=0)
    np.testing.assert_allclose(got[11:], hf_logits(hf_model, seq_c)[6:], atol=ATOL, rtol=0)


def test_mistral_without_window_matches(tiny_checkpoint):
    folder = tiny_checkpoint("MistralForCausalLM", sliding_window=None)
    got = PagedRunner(load_fd_model(folder)).step([("s", PROMPT)])
    np.testing.assert_allclose(got, hf_logits(load_hf_model(folder), PROMPT), atol=ATOL, rtol=0)


def test_mistral_sliding_window_is_refused(tiny_checkpoint):
    from fdcli_engine.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="sliding_window=8 .* is not supported"):
        load_fd_model(tiny_checkpoint("MistralForCausalLM", sliding_window=8))


def test_model_interface_attributes(tiny_checkpoint):
    model = load_fd_model(tiny_checkpoint("Qwen3ForCausalLM"))
    assert (model.num_layers, model.num_kv_heads, model.head_dim) == (2, 2, 32)
    assert (model.hidden_size, model.vocab_size) == (64, 512)


def test_weight_only_quantization_reaches_every_linear(tiny_checkpoint):
    """--quantization goes to every projection (not embedding/head); int8 perturbs the logits by a few
    percent (relative L2), int4 by more."""
    folder = tiny_checkpoint("LlamaForCausalLM")
    ref = PagedRunner(load_fd_model(folder)).step([("s", PROMPT)])
    errors = {}
    for quantization in ("wint8", "wint4"):
        model = load_fd_model(folder, quantization=quantization)
        for layer in model.layers:
            for lin in (
                layer.self_attn.qkv_proj,
                layer.self_attn.o_proj,
                layer.mlp.gate_up_proj,
                layer.mlp.down_proj,
            ):
                assert lin.lw.quantization == quantization
        got = PagedRunner(model).step([("s", PROMPT)])
        errors[quantization] = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert 1e-4 < errors["wint8"] < 0.05
    assert errors["wint4"] > 3 * errors["wint8"]
