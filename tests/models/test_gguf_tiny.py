"""Tiny checkpoints converted to GGUF the way llama.cpp does (tests/tiny_models.make_tiny_gguf): fd's
GGUF path (metadata, names, Llama q/k un-permutation, Qwen biases and q/k norms) against transformers
on the original HF weights. F32 GGUF: atol 1e-4 like the HF path. Q8_0: against transformers with the
same weights round-tripped through gguf's quantizer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_models import ARCHITECTURES, PagedRunner, load_fd_model, load_hf_model, make_tiny_gguf

from fdcli_engine.loader import read_model_config

PROMPT = [5, 17, 42, 99, 3, 250, 7, 128, 64, 311]


def hf_logits(hf_model, ids):
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0].numpy()


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_f32_gguf_matches_hf_weights(arch, tiny_checkpoint, tmp_path):
    folder = tiny_checkpoint(arch)
    path = make_tiny_gguf(folder, tmp_path / "tiny.gguf")
    cfg = read_model_config(path)
    assert cfg["architectures"] == [arch]
    assert (cfg["head_dim"], cfg["num_key_value_heads"], cfg["vocab_size"]) == (
        32 if arch == "Qwen3ForCausalLM" else 16,
        2,
        512,
    )
    assert cfg["attention_bias"] == (arch == "Qwen2ForCausalLM")
    assert cfg["tie_word_embeddings"] is False
    got = PagedRunner(load_fd_model(path)).step([("s", PROMPT)])
    np.testing.assert_allclose(got, hf_logits(load_hf_model(folder), PROMPT), atol=1e-4, rtol=0)


def test_q8_0_gguf_matches_round_tripped_weights(tiny_checkpoint, tmp_path):
    import gguf

    folder = tiny_checkpoint("LlamaForCausalLM")
    path = make_tiny_gguf(folder, tmp_path / "tiny-q8.gguf", qtype="Q8_0")
    hf = load_hf_model(folder)
    q8 = gguf.GGMLQuantizationType.Q8_0
    with torch.no_grad():
        for p in hf.parameters():
            if p.ndim == 2:
                w = p.numpy()
                p.copy_(torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(w, q8), q8)))
    expected = hf_logits(hf, PROMPT)
    got = PagedRunner(load_fd_model(path)).step([("s", PROMPT)])
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1"])
def test_quantization_gguf_keeps_blocks(qtype, tiny_checkpoint, tmp_path):
    """--quantization gguf: projections are prepared from raw blocks (merged QKV / gate_up concatenated
    as block rows), giving the same logits as dequantizing at load time."""
    path = make_tiny_gguf(tiny_checkpoint("Qwen2ForCausalLM"), tmp_path / "tiny.gguf", qtype=qtype)
    dense = PagedRunner(load_fd_model(path)).step([("s", PROMPT)])
    model = load_fd_model(path, quantization="gguf")
    qkv = model.layers[0].self_attn.qkv_proj
    assert qkv.lw.quantization.startswith("gguf:") and qkv.lw.bias is not None
    assert model.lm_head.lw.quantization.startswith("gguf:")  # the head reads blocks too
    np.testing.assert_allclose(PagedRunner(model).step([("s", PROMPT)]), dense, atol=1e-5, rtol=0)


def test_quantization_gguf_needs_a_gguf_model(tiny_checkpoint):
    from fdcli_engine.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="needs a .gguf model"):
        load_fd_model(tiny_checkpoint("LlamaForCausalLM"), quantization="gguf")


def test_native_gguf_blocks_match_reference(tiny_checkpoint, tmp_path):
    """The C++ block-quantized linear inside the whole model, against the reference ops (atol 1e-3)."""
    from fdcli_engine import ops

    path = make_tiny_gguf(tiny_checkpoint("LlamaForCausalLM"), tmp_path / "tiny.gguf", qtype="Q4_1")
    expected = PagedRunner(load_fd_model(path, quantization="gguf")).step([("s", PROMPT)])
    try:
        ops.use("native")
    except RuntimeError:
        pytest.skip("native kernels unavailable")
    model = load_fd_model(path, quantization="gguf")
    assert type(model.layers[0].mlp.down_proj.lw).__module__.startswith("fd_kernels")
    np.testing.assert_allclose(PagedRunner(model).step([("s", PROMPT)]), expected, atol=1e-3, rtol=0)
