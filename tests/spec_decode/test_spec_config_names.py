"""The spellings vLLM and FastDeploy users write in `--speculative-config` mean what they mean there:
vLLM's `ernie_mtp` (its ERNIE-4.5 docs), `eagle` / `eagle3` with a head (its spec-decode docs) and
older `[ngram]` / `"model": "ngram"`, FastDeploy's `max_ngram_size` / `min_ngram_size` (its
SpeculativeConfig's ngram keys) and `mtp_strategy`."""

from __future__ import annotations

import pytest

from fdcli_engine.errors import ConfigError
from fdcli_engine.speculative_config import parse_speculative_config


def test_vllm_ernie_mtp_is_mtp():
    # vLLM's ERNIE-4.5 recipe: the MTP layer read from the main checkpoint, named by `model`.
    cfg = parse_speculative_config(
        '{"method": "ernie_mtp", "model": "ERNIE-4.5-0.3B", "num_speculative_tokens": 1}'
    )
    assert (cfg.method, cfg.model, cfg.num_speculative_tokens) == ("mtp", "ERNIE-4.5-0.3B", 1)


@pytest.mark.parametrize(
    ("method", "head"),
    [("eagle", "yuhuili/EAGLE-LLaMA3.1-Instruct-8B"), ("eagle3", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")],
)
def test_vllm_eagle_launch_lines(method, head):
    # vLLM's speculative decoding docs: `vllm serve meta-llama/Llama-3.1-8B-Instruct --speculative-config
    # '{"method": "eagle", "model": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 3}'`.
    cfg = parse_speculative_config(
        f'{{"method": "{method}", "model": "{head}", "num_speculative_tokens": 3}}'
    )
    assert (cfg.method, cfg.model, cfg.num_speculative_tokens, cfg.uses_model) == (method, head, 3, True)


@pytest.mark.parametrize("spec", [{"method": "[ngram]"}, {"model": "ngram"}, {"model": "[ngram]"}])
def test_vllm_older_ngram_spellings(spec):
    cfg = parse_speculative_config({**spec, "num_speculative_tokens": 3})
    assert (cfg.method, cfg.model, cfg.num_speculative_tokens) == ("ngram", None, 3)


def test_fastdeploy_ngram_sizes_are_the_prompt_lookup_bounds():
    cfg = parse_speculative_config({"method": "ngram_match", "max_ngram_size": 4, "min_ngram_size": 3})
    assert (cfg.prompt_lookup_min, cfg.prompt_lookup_max) == (3, 4)
    same = parse_speculative_config({"method": "ngram", "prompt_lookup_max": 4, "max_ngram_size": 4})
    assert same.prompt_lookup_max == 4


def test_fastdeploy_ngram_size_errors_name_its_key():
    with pytest.raises(ConfigError, match="max_ngram_size must be an integer at least 1, got 0"):
        parse_speculative_config({"method": "ngram_match", "max_ngram_size": 0})
    with pytest.raises(ConfigError, match="prompt_lookup_max and max_ngram_size are one setting"):
        parse_speculative_config({"method": "ngram", "prompt_lookup_max": 4, "max_ngram_size": 5})


def test_fastdeploy_mtp_strategy():
    cfg = parse_speculative_config({"method": "mtp", "mtp_strategy": "default", "num_speculative_tokens": 2})
    assert (cfg.method, cfg.num_speculative_tokens) == ("mtp", 2)
    with pytest.raises(ConfigError, match="mtp_strategy 'with_ngram' is not supported"):
        parse_speculative_config({"method": "mtp", "mtp_strategy": "with_ngram"})


def test_vllm_draft_model_keys():
    # vLLM's draft-model recipes carry the draft's tensor parallel size and context limit.
    spec = {"method": "draft_model", "model": "small.gguf", "num_speculative_tokens": 4}
    cfg = parse_speculative_config({**spec, "draft_tensor_parallel_size": 1, "max_model_len": 4096})
    assert (cfg.method, cfg.model, cfg.num_speculative_tokens) == ("draft_model", "small.gguf", 4)
    with pytest.raises(ConfigError, match="draft_tensor_parallel_size must be 1"):
        parse_speculative_config({**spec, "draft_tensor_parallel_size": 2})
    with pytest.raises(ConfigError, match="max_model_len must be an integer at least 1"):
        parse_speculative_config({**spec, "max_model_len": 0})
