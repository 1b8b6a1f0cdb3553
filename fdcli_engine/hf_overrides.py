"""vLLM's --hf-overrides: keys laid over the model's config (config.json, or a GGUF file's metadata as
HF keys) before anything reads it; loader.read_model_config is where they apply.

vLLM's rules (vllm/config/model.py, ModelConfig._apply_dict_overrides; transformers_utils/config.py):
- a key whose value is not an object is set at the top level (PretrainedConfig.update), added if absent;
- an object given for a sub-config (text_config, vision_config, ...: a `*_config` key other than
  quantization_config, which transformers keeps as a plain dict) is merged into it key by key, and
  recursively wherever both sides are objects;
- any other object (rope_scaling, id2label, quantization_config, or a key the config lacks) replaces
  the value whole.
vLLM's Python form, a function of the transformers config object, has no counterpart: fd's config is a
dict read before any transformers class exists.
"""

from __future__ import annotations

import copy
from typing import Any

from fdcli_engine.errors import ConfigError

_NOT_SUB_CONFIGS = ("quantization_config",)


def check_hf_overrides(value: Any) -> None:
    """ConfigError unless `value` is None or an object of string keys."""
    if value is None:
        return
    if callable(value):
        raise ConfigError(
            "hf_overrides as a function is not supported: fd's model config is a dict, not a transformers "
            'config object; pass a dict of the keys to set, e.g. {"max_position_embeddings": 4096}'
        )
    if not isinstance(value, dict) or not all(isinstance(k, str) and k for k in value):
        raise ConfigError(
            f'--hf-overrides must be a JSON object of config keys, e.g. {{"rope_theta": 1e6}}, got {value!r}'
        )


def _is_sub_config(key: str, current: Any) -> bool:
    return isinstance(current, dict) and key.endswith("_config") and key not in _NOT_SUB_CONFIGS


def _merge(target: dict, updates: dict) -> None:
    # vLLM's _update_nested: recurse where both sides are objects, set otherwise.
    for key, value in updates.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def apply_hf_overrides(config: dict, overrides: dict | None) -> dict:
    """A copy of `config` with `overrides` applied by vLLM's rules (module docstring)."""
    if not overrides:
        return config
    out = copy.deepcopy(config)
    for key, value in overrides.items():
        if isinstance(value, dict) and _is_sub_config(key, out.get(key)):
            _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out
