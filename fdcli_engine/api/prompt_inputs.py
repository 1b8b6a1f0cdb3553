"""The prompt forms `LLM.generate` takes, as vLLM's offline API does, checked before any engine work.

One prompt is a `str`, a list of token ids, `{"prompt": str}` (vLLM's TextPrompt) or
`{"prompt_token_ids": [int, ...]}` (TokensPrompt; its `prompt` text, when given, is only reported
back); a batch is a list of any of these. As in vLLM, a flat list of ints is one prompt and
`prompt_token_ids` wins over `prompt`. Images come as `multi_modal_data` ({"image": PIL or a list})
with optional `mm_processor_kwargs` (api/llm_images.py). Keys that ask for something fd cannot do
(prompt embeddings, encoder-decoder prompts) are refused by name, so a request never runs without them.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

from fdcli_engine.api.llm_images import images_of

# vLLM prompt keys fd cannot honour, with what to say.
UNSUPPORTED_KEYS = {
    "multi_modal_uuids": "multi_modal_uuids are not supported: images are identified by their content",
    "prompt_embeds": "prompt embeddings are not supported: pass text or token ids",
    "encoder_prompt": "encoder-decoder prompts are not supported: this engine runs decoder-only models",
    "decoder_prompt": "encoder-decoder prompts are not supported: this engine runs decoder-only models",
}
PROMPT_KEYS = ("prompt", "prompt_token_ids", "cache_salt", "multi_modal_data", "mm_processor_kwargs")


@dataclass(frozen=True)
class ParsedPrompt:
    text: str | None  # reported back as RequestOutput.prompt
    token_ids: list[int] | None  # None: encode `text`
    cache_salt: str | None = None  # vLLM's prefix-cache isolation (SamplingParams.cache_salt)
    images: list = field(default_factory=list)  # multi_modal_data["image"]
    mm_processor_kwargs: dict | None = None


def _is_token(t) -> bool:
    # numbers.Integral: numpy's integer scalars too (a `.tolist()` away from ints); never a bool.
    return isinstance(t, numbers.Integral) and not isinstance(t, bool)


def _is_token_list(value) -> bool:
    return isinstance(value, list) and all(_is_token(t) for t in value)


def _token_ids(value, where: str) -> list[int]:
    if not isinstance(value, list):
        raise TypeError(f"{where}: token ids must be a list of ints, got {type(value).__name__}")
    for t in value:
        if not _is_token(t):
            raise TypeError(f"{where}: token ids must be ints, got {type(t).__name__} {t!r:.40}")
    return [int(t) for t in value]


def _from_dict(prompt: dict, where: str) -> ParsedPrompt:
    for key, why in UNSUPPORTED_KEYS.items():
        if prompt.get(key) is not None:
            raise ValueError(f"{where}: {key!r}: {why}")
    unknown = sorted(set(prompt) - set(PROMPT_KEYS) - set(UNSUPPORTED_KEYS))
    if unknown:
        raise ValueError(
            f"{where}: unknown prompt key(s) {unknown}; a prompt dict takes 'prompt' or 'prompt_token_ids'"
        )
    text = prompt.get("prompt")
    if text is not None and not isinstance(text, str):
        raise TypeError(f"{where}: 'prompt' must be a str, got {type(text).__name__}")
    salt = prompt.get("cache_salt")
    if salt is not None and not isinstance(salt, str):
        raise TypeError(f"{where}: 'cache_salt' must be a str, got {type(salt).__name__}")
    mm = prompt.get("multi_modal_data")
    images = images_of(mm, where) if mm is not None else []
    kwargs = prompt.get("mm_processor_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"{where}: 'mm_processor_kwargs' must be a dict, got {type(kwargs).__name__}")
    if "prompt_token_ids" in prompt:
        ids = _token_ids(prompt["prompt_token_ids"], f"{where}: 'prompt_token_ids'")
        return ParsedPrompt(text, ids, salt, images, kwargs)
    if text is None:
        raise ValueError(f"{where}: a prompt dict needs 'prompt' (text) or 'prompt_token_ids' (list of ints)")
    return ParsedPrompt(text, None, salt, images, kwargs)


def parse_one(prompt, where: str) -> ParsedPrompt:
    if isinstance(prompt, str):
        return ParsedPrompt(prompt, None)
    if isinstance(prompt, dict):
        return _from_dict(prompt, where)
    if isinstance(prompt, list):
        return ParsedPrompt(None, _token_ids(prompt, where))
    raise TypeError(
        f"{where}: expected a str, a list of token ids, {{'prompt': str}} or {{'prompt_token_ids': [...]}}, "
        f"got {type(prompt).__name__}"
    )


def parse_prompts(prompts) -> list[ParsedPrompt]:
    """One prompt or a batch, as vLLM reads them; raises TypeError/ValueError naming the bad prompt."""
    if not isinstance(prompts, (list, tuple)) or (prompts and _is_token_list(prompts)):
        return [parse_one(prompts, "prompt")]
    return [parse_one(p, f"prompts[{i}]") for i, p in enumerate(prompts)]
