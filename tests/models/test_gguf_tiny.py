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
