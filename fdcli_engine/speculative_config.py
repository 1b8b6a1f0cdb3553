"""`--speculative-config`: what the user asks of speculative decoding, checked once, before paddle loads.

FastDeploy's keys and vLLM's are both accepted under their own names (one meaning each):
- `method`: "ngram" (vLLM; also "[ngram]", or `model` "ngram" without a method) / "ngram_match"
  (FastDeploy): prompt lookup from the request's own tokens; "mtp" (vLLM's "ernie_mtp" too): ERNIE-4.5's
  multi-token-prediction layer; "draft_model": a smaller model with the same vocabulary; "eagle" /
  "eagle3" (vLLM): an EAGLE-1 / EAGLE-3 head trained for the target (its folder in `model`).
  FastDeploy's "naive" (its speculative code path without drafts) means no speculation here.
- `num_speculative_tokens`: drafts per step (FastDeploy's cap, 5, is not fd's; fd allows up to 16).
- `prompt_lookup_min` / `prompt_lookup_max` (vLLM), `min_ngram_size` / `max_ngram_size` (FastDeploy):
  ngram's shortest and longest suffix n-gram matched.
- `model`: the MTP folder (when the main checkpoint does not carry the layer), the draft model or the
  EAGLE head.
- `quantization`: the draft model's (default: the target's).
- `num_model_steps` (FastDeploy's MTP): equal to num_speculative_tokens (hybrid MTP + ngram is not built).
- `disable_by_batch_size` (vLLM): no drafts in a step where at least this many requests run.
- `verify_strategy` / `accept_policy` (FastDeploy): only the exact ones, "target_match" / "normal".
- `mtp_strategy` (FastDeploy): only "default" (its "with_ngram" hybrid is not built).
- `draft_tensor_parallel_size` (vLLM): 1 only (the draft runs unsharded, in the target's process).
- `max_model_len` (vLLM): the draft's context limit; accepted, no effect (fd drafts over the whole
  context, and drafts never change the output).

Verification is exact whatever the method: a greedy request's tokens are those it would get without
speculation, a sampled one's follow the same distribution (runner/spec_decode.py says how).
Leaf module: imports msgspec and the errors only.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from fdcli_engine.errors import ConfigError

METHODS = ("ngram", "mtp", "draft_model", "eagle", "eagle3")
_METHOD_ALIASES = {
    "ngram": "ngram",
    "[ngram]": "ngram",  # vLLM's older spelling
    "ngram_match": "ngram",  # FastDeploy's
    "mtp": "mtp",
    "ernie_mtp": "mtp",  # vLLM's name for ERNIE-4.5's MTP layer
    "draft_model": "draft_model",
    "eagle": "eagle",
    "eagle3": "eagle3",
}
# Each EAGLE method's example head (vLLM's docs), named where `model` is missing.
_EAGLE_EXAMPLES = {
    "eagle": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B",
    "eagle3": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
}
# FastDeploy's name for a key -> the vLLM name it means (one meaning, two spellings).
_KEY_ALIASES = {"min_ngram_size": "prompt_lookup_min", "max_ngram_size": "prompt_lookup_max"}
MAX_SPECULATIVE_TOKENS = 16
QUANTIZATIONS = ("auto", "none", "wint8", "wint4", "gguf")  # the draft model's (`quantization`)
_KEYS = (
    "method",
    "num_speculative_tokens",
    "prompt_lookup_min",
    "prompt_lookup_max",
    "model",
    "quantization",
    "num_model_steps",
    "disable_by_batch_size",
    "verify_strategy",
    "accept_policy",
    "mtp_strategy",
    "draft_tensor_parallel_size",
    "max_model_len",
    *_KEY_ALIASES,
)


class SpeculativeConfig(msgspec.Struct, frozen=True, kw_only=True):
    method: str  # one of METHODS
    num_speculative_tokens: int = 1
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 5
    model: str | None = None  # draft model / MTP folder / EAGLE head; None: MTP from the main checkpoint
    quantization: str | None = None  # the draft model's; None: the target's
    disable_by_batch_size: int | None = None

    @property
    def uses_model(self) -> bool:
        """Drafts come from a model forward (its own KV cache in the same block pool)."""
        return self.method in ("mtp", "draft_model", "eagle", "eagle3")

    def describe(self) -> str:
        """The start-up line's words for it."""
        extra = (
            f", prompt lookup {self.prompt_lookup_min}-{self.prompt_lookup_max}"
            if self.method == "ngram"
            else (f", model {self.model}" if self.model else "")
        )
        return f"{self.method}, {self.num_speculative_tokens} token(s) per step{extra}"


def _int(values: dict, key: str, default: int | None, lo: int, hi: int | None = None) -> int | None:
    """values[key] (or its FastDeploy spelling), an integer in [lo, hi]; the error names the key given."""
    alias = next((a for a, k in _KEY_ALIASES.items() if k == key and a in values), None)
    if alias is not None and key in values and values[key] != values[alias]:
        raise ConfigError(f"--speculative-config: {key} and {alias} are one setting; they disagree")
    name = alias if alias is not None else key
    value = values.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
        raise ConfigError(f"--speculative-config: {name} must be an integer {bound}, got {value!r}")
    return value


def check_quantization(name: str) -> None:
    """The draft model's quantization: one of QUANTIZATIONS (runner/draft_model_proposer resolves it)."""
    if name not in QUANTIZATIONS:
        raise ConfigError(
            f"--speculative-config: quantization {name!r} is not supported: use wint8, wint4, gguf or none"
        )


def parse_speculative_config(value: Any) -> SpeculativeConfig | None:
    """The flag's JSON text or the YAML / `LLM(...)` mapping → a SpeculativeConfig, or None (not
    given, or FastDeploy's "naive"). Every mistake is one ConfigError line naming the key."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ConfigError(f"--speculative-config is not valid JSON: {e.msg} (column {e.colno})") from None
    if not isinstance(value, dict):
        raise ConfigError('--speculative-config must be a JSON object, e.g. \'{"method": "ngram"}\'')
    unknown = sorted(set(value) - set(_KEYS))
    if unknown:
        raise ConfigError(
            f"--speculative-config: unknown key(s) {', '.join(unknown)} (fd reads {', '.join(_KEYS)})"
        )
    method = value.get("method")
    model = value.get("model")
    if method is None and model in ("ngram", "[ngram]"):
        method, model = "ngram", None  # vLLM's older form: the model named "ngram"
    elif method is None and model:
        method = "draft_model"  # vLLM: a model without a method is a draft model
    if method == "naive":
        return None
    if method not in _METHOD_ALIASES:
        raise ConfigError(
            f"--speculative-config: method {method!r} is not supported: use ngram (or ngram_match), "
            "mtp, draft_model, eagle or eagle3"
        )
    method = _METHOD_ALIASES[method]
    for key, exact in (("verify_strategy", "target_match"), ("accept_policy", "normal")):
        given = value.get(key, exact)
        if given != exact:
            raise ConfigError(
                f"--speculative-config: {key} {given!r} is not supported: fd verifies exactly "
                f"({key} {exact!r}), so outputs keep the distribution they have without speculation"
            )
    if _int(value, "draft_tensor_parallel_size", 1, 1) != 1:
        raise ConfigError(
            "--speculative-config: draft_tensor_parallel_size must be 1: fd runs the draft unsharded, in "
            "the target's process"
        )
    _int(value, "max_model_len", None, 1)
    if value.get("mtp_strategy", "default") != "default":
        raise ConfigError(
            f"--speculative-config: mtp_strategy {value['mtp_strategy']!r} is not supported: fd drafts with "
            'one method (mtp_strategy "default"); the hybrid MTP + ngram strategy is not built'
        )
    k = _int(value, "num_speculative_tokens", 1, 1, MAX_SPECULATIVE_TOKENS)
    steps = _int(value, "num_model_steps", k, 1, MAX_SPECULATIVE_TOKENS)
    if steps != k:
        raise ConfigError(
            "--speculative-config: num_model_steps must equal num_speculative_tokens (MTP drafts every "
            "token; the hybrid MTP + ngram strategy is not supported)"
        )
    lo = _int(value, "prompt_lookup_min", None, 1)
    hi = _int(value, "prompt_lookup_max", None, 1)
    lo, hi = lo or min(2, hi or 5), hi or max(5, lo or 1)
    if lo > hi:
        raise ConfigError(
            f"--speculative-config: prompt_lookup_min {lo} is larger than prompt_lookup_max {hi}"
        )
    if model is not None and not isinstance(model, str):
        raise ConfigError("--speculative-config: model must be a path string")
    if method == "draft_model" and not model:
        raise ConfigError('--speculative-config: method draft_model needs "model": the draft model\'s path')
    if method in _EAGLE_EXAMPLES and not model:
        raise ConfigError(
            f'--speculative-config: method {method} needs "model": the EAGLE head\'s path (e.g. '
            f'"{_EAGLE_EXAMPLES[method]}", a head vLLM\'s docs pair with Llama-3.1-8B-Instruct)'
        )
    if method == "ngram" and model:
        raise ConfigError("--speculative-config: method ngram takes no model (it drafts from the prompt)")
    quantization = value.get("quantization")
    if quantization is not None and not isinstance(quantization, str):
        raise ConfigError('--speculative-config: quantization must be a string such as "wint8"')
    if quantization is not None:
        check_quantization(quantization.lower())
    return SpeculativeConfig(
        method=method,
        num_speculative_tokens=k,
        prompt_lookup_min=lo,
        prompt_lookup_max=hi,
        model=model,
        quantization=quantization.lower() if quantization else None,
        disable_by_batch_size=_int(value, "disable_by_batch_size", None, 1),
    )
