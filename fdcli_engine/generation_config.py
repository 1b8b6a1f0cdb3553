"""The model's default sampling parameters: vLLM's --generation-config and --override-generation-config.

vLLM's rules (ModelConfig.get_diff_sampling_param), kept here:
- `generation_config` "auto" (default): the sampling keys of the model folder's generation_config.json;
  "vllm": none (the engine's own defaults); any other value: a folder holding generation_config.json
  (or that file itself). A GGUF file has no generation_config.json and its metadata no sampling keys,
  so "auto" gives it no defaults (vLLM skips GGUF files the same way).
- `override_generation_config` (a JSON object) is laid over what was read, with "vllm" too.
- Only SAMPLING_KEYS count (do_sample, eos ids and the rest do not); a key whose value is null is
  absent. HF's `max_new_tokens` becomes `max_tokens`. Every value the file sets counts, as
  transformers 5's to_diff_dict keeps it (its defaults are all None).
- Use: a request field left out takes the default, one the request sets always wins; the default
  max_tokens is still capped by the room the context leaves (request_limits.check_request).

`sampling_defaults` runs once, in config_resolver.resolve_config; the result travels in the
ResolvedConfig (`default_sampling_params`) and the serving layer (serving_common.build_params,
check_prompt) and `LLM.get_default_sampling_params` read it. Leaf module: imports only errors and
sampling_params.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fdcli_engine.errors import ConfigError, InvalidRequestError
from fdcli_engine.sampling_params import SamplingParams

GENERATION_CONFIG_FILE = "generation_config.json"
# generation_config.json key -> SamplingParams field (vLLM's list of the keys it applies).
SAMPLING_KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}
_INT_KEYS = ("top_k", "max_new_tokens")


def check_generation_options(generation_config: str, override: dict | None) -> None:
    """What needs no model: the mode is a non-empty string, the override's keys and values are valid
    sampling defaults (ConfigError naming the flag)."""
    if not isinstance(generation_config, str) or not generation_config.strip():
        raise ConfigError("--generation-config must be auto, vllm or a folder holding generation_config.json")
    if override:
        _sampling_values(override, "--override-generation-config", strict=True)


def sampling_defaults(
    generation_config: str, override: dict | None, model_path: Path | None
) -> tuple[dict[str, Any], str | None]:
    """({SamplingParams field: value} a request takes where it sets no value of its own, the one
    start-up line that says which apply and from where, or None when none do): vLLM's
    get_diff_sampling_param. `model_path`: the resolved --model (a folder or a .gguf file)."""
    values: dict[str, Any] = {}
    sources = []
    if generation_config != "vllm":
        path = _config_file(generation_config, model_path)
        if path is not None:
            values = _sampling_values(_read(path), str(path), strict=False)
            sources += [str(path)] if values else []
    if override:
        values.update(_sampling_values(override, "--override-generation-config", strict=True))
        sources.append("--override-generation-config")
    if not values:
        return values, None
    shown = ", ".join(f"{k}={v}" for k, v in values.items())
    note = (
        f"default sampling parameters from {' and '.join(sources)}: {shown}; a request's own values win "
        "(--generation-config vllm turns the model's off)"
    )
    return values, note


def _config_file(generation_config: str, model_path: Path | None) -> Path | None:
    """The generation_config.json to read: the model folder's for "auto" (None when it has none, or
    the model is a file), else the named folder's, which must exist."""
    if generation_config == "auto":
        if model_path is None or not model_path.is_dir():
            return None
        path = model_path / GENERATION_CONFIG_FILE
        return path if path.is_file() else None
    given = Path(generation_config).expanduser()
    path = given / GENERATION_CONFIG_FILE if given.is_dir() else given
    if not path.is_file() or path.suffix != ".json":
        raise ConfigError(
            f"--generation-config {generation_config!r}: no {GENERATION_CONFIG_FILE} there; use auto (the "
            f"model's), vllm (fd's defaults) or a folder holding {GENERATION_CONFIG_FILE}"
        )
    return path


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"--generation-config: cannot read {path} as JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--generation-config: {path} must hold a JSON object")
    return data


def _sampling_values(config: dict, source: str, strict: bool) -> dict[str, Any]:
    """The SAMPLING_KEYS of `config` as SamplingParams fields, checked (a ConfigError naming `source`).
    `strict`: any other key is an error (the override); a generation_config.json holds many others."""
    if strict:
        unknown = sorted(set(config) - set(SAMPLING_KEYS))
        if unknown:
            hint = (
                " (max_tokens is max_new_tokens here, as in generation_config.json)"
                if "max_tokens" in unknown
                else ""
            )
            raise ConfigError(
                f"{source}: unknown key(s) {', '.join(map(str, unknown))}; it takes "
                f"{', '.join(SAMPLING_KEYS)}{hint}"
            )
    values: dict[str, Any] = {}
    for key, field in SAMPLING_KEYS.items():
        value = config.get(key)
        if value is None:
            continue
        kind = int if key in _INT_KEYS else (int, float)
        if isinstance(value, bool) or not isinstance(value, kind):
            want = "an integer" if key in _INT_KEYS else "a number"
            raise ConfigError(f"{source}: {key} must be {want}, got {value!r}")
        values[field] = value
    try:  # the ranges a request's own values meet (SamplingParams.validate)
        SamplingParams(**values)
    except InvalidRequestError as exc:
        raise ConfigError(f"{source}: {str(exc).replace('max_tokens', 'max_new_tokens')}") from None
    return values
