"""vLLM's hf_overrides (--hf-overrides, LLM(hf_overrides=...)): keys laid over the model's config before
anything reads it. Checked on the tiny random Llama: a changed rope_theta gives transformers' logits for
the same changed config, max_position_embeddings sets the context limit, and vLLM's merge rules
(vllm/config/model.py _apply_dict_overrides) hold for sub-configs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tiny_models
from test_engine_e2e import prompts_of
from test_prompt_logprobs import K, check_against

from fdcli_engine import LLM, SamplingParams
from fdcli_engine.errors import ConfigError, ModelLoadError
from fdcli_engine.hf_overrides import apply_hf_overrides
from fdcli_engine.loader import read_model_config

THETA = 1e6  # the checkpoint's is 1e4: positions up to 60 rotate visibly differently


def hf_log_softmax_with_theta(folder, prompts, theta):
    import torch
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder)
    config.rope_parameters = {**config.rope_parameters, "rope_theta": theta}
    hf = tiny_models.load_hf_model(folder, config=config)
    with torch.no_grad():
        return [torch.log_softmax(hf(torch.tensor([p])).logits[0].double(), -1).numpy() for p in prompts]


def test_rope_theta_override_gives_transformers_logits_of_the_changed_config(tiny_model_dir):
    folder = tiny_model_dir("LlamaForCausalLM")
    prompts = prompts_of(2, seed=11, lo=40, hi=60)
    refs = hf_log_softmax_with_theta(folder, prompts, THETA)
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=K)
    opts = dict(max_model_len=128, block_size=8, num_kv_blocks=64)
    outs = LLM(str(folder), hf_overrides={"rope_theta": THETA}, **opts).generate(prompts, params)
    check_against(prompts, outs, refs, "float32")
    # Without the override the logprobs are far from that reference: the override took effect.
    plain = LLM(str(folder), **opts).generate(prompts[:1], params)[0].prompt_logprobs
    p = prompts[0]
    gap = max(abs(plain[i][p[i]].logprob - refs[0][i - 1][p[i]]) for i in range(1, len(p)))
    assert gap > 1e-2


def test_max_position_embeddings_override_sets_the_context_limit(tiny_model_dir):
    folder = tiny_model_dir("LlamaForCausalLM")  # max_position_embeddings 256
    llm = LLM(str(folder), hf_overrides={"max_position_embeddings": 96}, block_size=8, num_kv_blocks=64)
    assert llm.config.max_model_len == 96 and llm.config.hf_config["max_position_embeddings"] == 96
    with pytest.raises(ConfigError, match="200 exceeds the model.s limit of 96"):
        LLM(str(folder), hf_overrides={"max_position_embeddings": 96}, max_model_len=200)


def test_architectures_override_picks_the_model_class(tiny_model_dir):
    folder = tiny_model_dir("LlamaForCausalLM")
    with pytest.raises(ModelLoadError, match="architecture .NoSuchForCausalLM. is not supported"):
        LLM(str(folder), hf_overrides={"architectures": ["NoSuchForCausalLM"]}, max_model_len=64)


def test_a_function_is_refused_naming_the_dict_form(tiny_model_dir):
    with pytest.raises(ConfigError, match="hf_overrides as a function is not supported.*pass a dict"):
        LLM(str(tiny_model_dir("LlamaForCausalLM")), hf_overrides=lambda config: config)


def test_sub_configs_merge_and_other_objects_replace():
    """vLLM: an object for a sub-config merges into it (recursively); any other object replaces the
    value (rope_scaling, quantization_config); a scalar is set at the top level."""
    cfg = {
        "text_config": {"hidden_size": 8, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
        "vision_config": {"depth": 2},
        "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        "quantization_config": {"quant_method": "fp8", "bits": 8},
    }
    out = apply_hf_overrides(
        cfg,
        {
            "text_config": {"rope_parameters": {"rope_theta": 5e5}},
            "vision_config": {"hidden_act": "relu"},
            "rope_scaling": {"factor": 4.0},
            "quantization_config": {"bits": 4},
            "eos_token_id": 7,
        },
    )
    assert out["text_config"] == {
        "hidden_size": 8,
        "rope_parameters": {"rope_type": "default", "rope_theta": 5e5},
    }
    assert out["vision_config"] == {"depth": 2, "hidden_act": "relu"}
    assert out["rope_scaling"] == {"factor": 4.0}
    assert out["quantization_config"] == {"bits": 4}
    assert out["eos_token_id"] == 7
    assert cfg["text_config"]["rope_parameters"]["rope_theta"] == 1e4  # the stored config is unchanged


def test_text_config_overrides_reach_the_lifted_language_model_keys(tmp_path):
    """A multimodal wrapper's language-model keys live in text_config: an override there is what the
    decoder reads; a top-level one is shadowed by text_config's own value, as in vLLM (hf_text_config)."""
    stored = {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "text_config": {"hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 512},
        "vision_config": {"depth": 2},
    }
    (tmp_path / "config.json").write_text(json.dumps(stored))
    assert read_model_config(tmp_path)["max_position_embeddings"] == 512
    cfg = read_model_config(tmp_path, {"text_config": {"max_position_embeddings": 128}})
    assert cfg["max_position_embeddings"] == 128 and cfg["vision_config"] == {"depth": 2}
    assert read_model_config(tmp_path, {"max_position_embeddings": 128})["max_position_embeddings"] == 512
    assert np.isclose(read_model_config(tmp_path, {"text_config": {"rope_theta": 3.0}})["rope_theta"], 3.0)


def test_a_gguf_files_metadata_takes_them(tiny_model_dir, tmp_path):
    """A GGUF file's config is its metadata read as HF keys: the overrides apply to it the same way."""
    path = tiny_models.make_tiny_gguf(tiny_model_dir("LlamaForCausalLM"), tmp_path / "tiny.gguf")
    assert read_model_config(path)["max_position_embeddings"] == 256
    cfg = read_model_config(path, {"max_position_embeddings": 64, "rope_theta": 5e5})
    assert (cfg["max_position_embeddings"], cfg["rope_theta"]) == (64, 5e5)
