"""The resolved config is decided once and crosses to the engine-core process unchanged."""

from __future__ import annotations

import dataclasses

import pytest

from fdcli_engine.config import EngineConfig, default_model_path
from fdcli_engine.config_resolver import resolve_config
from fdcli_engine.errors import ConfigError
from fdcli_engine.resolved_config import ResolvedConfig


def test_default_model_resolves_every_auto():
    r = resolve_config(EngineConfig(max_model_len=64))
    assert r.model_path == default_model_path() and r.model == str(default_model_path())
    assert (r.layout, r.quantization, r.kv_cache_dtype, r.runner, r.convert) == (
        "gguf",
        "gguf",
        "bfloat16",
        "generate",
        "none",
    )
    assert r.max_model_len == 64 and r.max_num_batched_tokens == 2048 and r.num_threads >= 1
    assert r.hf_config["architectures"]


def test_resolved_config_crosses_the_process_seam_unchanged():
    r = resolve_config(EngineConfig(max_model_len=64, kv_cache_dtype="int8"))
    back = ResolvedConfig.from_json(r.to_json())
    assert back == r and back.model_path == r.model_path and back.is_c8_kv_cache


def test_configs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        EngineConfig().max_model_len = 3  # type: ignore[misc]
    with pytest.raises(AttributeError):
        ResolvedConfig().max_model_len = 3  # type: ignore[misc]
    assert EngineConfig().replace(block_size=32).block_size == 32


def test_validate_returns_a_normalized_copy():
    c = EngineConfig(quantization="none", kv_cache_dtype="BF16", dtype="auto")
    v = c.validate()
    assert (v.quantization, v.kv_cache_dtype, v.dtype, v.max_num_batched_tokens) == (
        None,
        "bfloat16",
        "float32",
        2048,
    )
    assert (c.quantization, c.kv_cache_dtype) == ("none", "BF16")
    with pytest.raises(ConfigError, match="exceeds the model's limit"):
        EngineConfig(max_model_len=100).validate(model_limit=64)


def test_engine_watchdog_timeout_crosses_and_is_checked():
    r = resolve_config(EngineConfig(max_model_len=64, engine_watchdog_timeout=7.5))
    assert ResolvedConfig.from_json(r.to_json()).engine_watchdog_timeout == 7.5
    assert EngineConfig().validate().engine_watchdog_timeout == 300.0
    with pytest.raises(ConfigError, match="--engine-watchdog-timeout"):
        EngineConfig(engine_watchdog_timeout=-1).validate()


@pytest.mark.parametrize("given, expected", [(None, 8192), (-1, 16384), (1000, 1000)])
def test_max_model_len_auto_is_the_models_limit_uncapped(tmp_path, given, expected):
    # vLLM's --max-model-len -1 / auto: the model's own maximum; fd's default caps it at 8192.
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tiny_models import make_tiny_checkpoint

    folder = make_tiny_checkpoint("LlamaForCausalLM", tmp_path / "m", max_position_embeddings=16384)
    r = resolve_config(EngineConfig(model=str(folder), max_model_len=given, enable_chunked_prefill=True))
    assert r.max_model_len == expected
