"""Loader: HF config normalization, bf16 and sharded safetensors, GGUF name mapping and q/k row
un-permutation, and every user-caused failure as a one-line ModelLoadError naming the file."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from tiny_models import PagedRunner, load_fd_model, load_hf_model

from fdcli_engine.config import default_model_path
from fdcli_engine.errors import ModelLoadError
from fdcli_engine.loader import detect_layout, load_model, read_model_config
from fdcli_engine.loader.gguf_io import gguf_to_hf_name, unpermute_qk
from fdcli_engine.resolved_config import ResolvedConfig

PROMPT = [5, 17, 42, 99, 3, 250, 7, 128, 64, 311]


def expect_load_error(path, match: str) -> str:
    with pytest.raises(ModelLoadError) as info:
        load_model(ResolvedConfig(model=str(path), model_path=path))
    msg = str(info.value)
    assert "\n" not in msg and match in msg, msg
    return msg


def test_read_config_normalizes_rope_parameters(tiny_checkpoint):
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    folder = tiny_checkpoint("LlamaForCausalLM", rope_theta=5000.0, rope_scaling=scaling)
    raw = json.loads((folder / "config.json").read_text())
    assert "rope_parameters" in raw  # transformers 5 spelling on disk
    cfg = read_model_config(folder)
    assert cfg["rope_theta"] == 5000.0
    assert cfg["rope_scaling"] == scaling
    assert (cfg["head_dim"], cfg["num_key_value_heads"], cfg["architectures"]) == (
        16,
        2,
        ["LlamaForCausalLM"],
    )
    assert read_model_config(tiny_checkpoint("Qwen3ForCausalLM"))["rope_scaling"] is None


def test_bf16_checkpoint_loads_as_fp32(tiny_checkpoint, tmp_path):
    """bf16 on disk: fd widens it to fp32, matching transformers run in fp32 on the same bf16 values."""
    hf = load_hf_model(tiny_checkpoint("Qwen2ForCausalLM")).to(torch.bfloat16)
    hf.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text()).get("dtype") == "bfloat16"
    # Reloaded in fp32 (not .float()): .to(bfloat16) also rounded HF's rotary inv_freq buffer.
    hf = load_hf_model(tmp_path, dtype=torch.float32)
    with torch.no_grad():
        expected = hf(torch.tensor([PROMPT])).logits[0].numpy()
    got = PagedRunner(load_fd_model(tmp_path)).step([("s", PROMPT)])
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)


def test_sharded_checkpoint_with_index(tiny_checkpoint, tmp_path):
    single = tiny_checkpoint("LlamaForCausalLM")
    load_hf_model(single).save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 2
    got = PagedRunner(load_fd_model(tmp_path)).step([("s", PROMPT)])
    expected = PagedRunner(load_fd_model(single)).step([("s", PROMPT)])
    np.testing.assert_array_equal(got, expected)


def test_gguf_names_map_to_hf():
    assert gguf_to_hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert gguf_to_hf_name("blk.12.attn_output.weight") == "model.layers.12.self_attn.o_proj.weight"
    assert gguf_to_hf_name("blk.3.attn_q.bias") == "model.layers.3.self_attn.q_proj.bias"
    assert gguf_to_hf_name("blk.0.ffn_gate.weight") == "model.layers.0.mlp.gate_proj.weight"
    assert gguf_to_hf_name("blk.1.attn_k_norm.weight") == "model.layers.1.self_attn.k_norm.weight"
    assert gguf_to_hf_name("rope_freqs.weight") is None


@pytest.mark.parametrize("dtype", [np.float32, np.uint8])
def test_unpermute_qk_inverts_llama_cpp_row_order(dtype):
    """llama.cpp stores, per head, row j of the first half at 2j and row j of the second half at 2j+1
    (its interleaved rotary). Built by hand here, then undone."""
    heads, head_dim, width = 3, 8, 5
    hf_rows = np.arange(heads * head_dim * width).reshape(heads * head_dim, width).astype(dtype)
    gguf_rows = np.empty_like(hf_rows)
    half = head_dim // 2
    for h in range(heads):
        for j in range(half):
            gguf_rows[h * head_dim + 2 * j] = hf_rows[h * head_dim + j]
            gguf_rows[h * head_dim + 2 * j + 1] = hf_rows[h * head_dim + half + j]
    np.testing.assert_array_equal(unpermute_qk(gguf_rows, heads), hf_rows)


def test_missing_path(tmp_path):
    expect_load_error(tmp_path / "nope", "does not exist")


def test_folder_without_model(tmp_path):
    (tmp_path / "readme.txt").write_text("hi")
    expect_load_error(tmp_path, "not a model folder")
    with pytest.raises(ModelLoadError, match="not a model"):
        detect_layout(tmp_path / "readme.txt")


def test_unknown_architecture_lists_supported(tiny_checkpoint, tmp_path):
    shutil.copytree(tiny_checkpoint("LlamaForCausalLM"), tmp_path, dirs_exist_ok=True)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["architectures"] = ["MambaForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    msg = expect_load_error(tmp_path, "'MambaForCausalLM' is not supported")
    assert str(tmp_path / "config.json") in msg
    assert "LlamaForCausalLM" in msg and "Qwen3ForCausalLM" in msg


def test_unknown_rope_scaling_is_an_error(tiny_checkpoint, tmp_path):
    shutil.copytree(tiny_checkpoint("LlamaForCausalLM"), tmp_path, dirs_exist_ok=True)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_theta": 10000.0, "rope_type": "yarn", "factor": 4.0}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    msg = expect_load_error(tmp_path, "rope_scaling type 'yarn' is not supported")
    assert msg.startswith(str(tmp_path))


def test_truncated_safetensors(tiny_checkpoint, tmp_path):
    shutil.copytree(tiny_checkpoint("LlamaForCausalLM"), tmp_path, dirs_exist_ok=True)
    weights = tmp_path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    msg = expect_load_error(tmp_path, "truncated safetensors file")
    assert str(weights) in msg
    weights.write_bytes(b"\x00\x01")
    expect_load_error(tmp_path, "not a valid safetensors file")


def test_missing_tensor_is_named(tiny_checkpoint, tmp_path):
    from safetensors.numpy import load_file, save_file

    shutil.copytree(tiny_checkpoint("LlamaForCausalLM"), tmp_path, dirs_exist_ok=True)
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    expect_load_error(tmp_path, "missing tensor(s): model.layers.1.self_attn.k_proj.weight")


def test_wrong_tensor_shape_is_named(tiny_checkpoint, tmp_path):
    from safetensors.numpy import load_file, save_file

    shutil.copytree(tiny_checkpoint("LlamaForCausalLM"), tmp_path, dirs_exist_ok=True)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["model.layers.0.mlp.down_proj.weight"] = np.zeros((64, 100), np.float32)
    save_file(tensors, tmp_path / "model.safetensors")
    expect_load_error(tmp_path, "tensor model.layers.0.mlp.down_proj.weight: weight shape (64, 100)")


def test_truncated_gguf(tmp_path):
    """The first 1 MiB of SmolLM2: header cut inside the vocabulary."""
    path = tmp_path / "cut.gguf"
    with open(default_model_path(), "rb") as f:
        path.write_bytes(f.read(1 << 20))
    msg = expect_load_error(path, "not a valid GGUF file or truncated")
    assert msg.startswith(str(path))


def test_bad_config_json(tiny_checkpoint, tmp_path):
    shutil.copytree(tiny_checkpoint("LlamaForCausalLM"), tmp_path, dirs_exist_ok=True)
    config = tmp_path / "config.json"
    cfg = json.loads(config.read_text())
    config.write_text("{not json")
    expect_load_error(tmp_path, "cannot read config.json")
    del cfg["intermediate_size"]
    config.write_text(json.dumps(cfg))
    expect_load_error(tmp_path, "config lacks or has an invalid field (KeyError: 'intermediate_size')")
    del cfg["num_attention_heads"]
    config.write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="num_attention_heads"):
        read_model_config(tmp_path)


def test_unsupported_gguf_architecture(tiny_checkpoint, tmp_path):
    from tiny_models import make_tiny_gguf

    path = make_tiny_gguf(tiny_checkpoint("LlamaForCausalLM"), tmp_path / "g.gguf", arch="gemma")
    msg = expect_load_error(
        path, "GGUF architecture 'gemma' is not supported; supported: llama, qwen2, qwen3"
    )
    assert msg.startswith(str(path))


def test_unannounced_layer_tensor_is_an_error(tiny_checkpoint, tmp_path):
    """A q_proj bias in a Llama checkpoint whose config says attention_bias=false must not be dropped."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(tiny_checkpoint("LlamaForCausalLM"), tmp_path, dirs_exist_ok=True)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["model.layers.0.self_attn.q_proj.bias"] = np.ones(64, np.float32)
    save_file(tensors, tmp_path / "model.safetensors")
    expect_load_error(tmp_path, "tensor model.layers.0.self_attn.q_proj.bias is not part of LlamaForCausalLM")
