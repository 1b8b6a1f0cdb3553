"""`--limit-mm-per-prompt` (vLLM's; `LLM(limit_mm_per_prompt=...)`): the most images one request may
carry. vLLM's forms: JSON `{"image": 4}`, its configurable `{"image": {"count": 4, "width": W, "height":
H}}` and the older `image=4`; other modalities are refused unless 0.

Leaf module: imports the errors only.
"""

from __future__ import annotations

import json

from fdcli_engine.errors import ConfigError

DEFAULT_IMAGE_LIMIT = 16  # images per request without --limit-mm-per-prompt (vLLM's is 999)

_LIMIT_EXAMPLE = "'{\"image\": 4}'"
# vLLM's per-modality options beside the count: sizes of the dummy inputs it profiles memory with. fd
# does not profile, so they change nothing; any other key is refused as vLLM refuses it.
_IMAGE_LIMIT_OPTIONS = ("count", "width", "height")


def _limit_mapping(value: str) -> dict:
    """--limit-mm-per-prompt's text: vLLM's JSON, or its older KEY=VALUE[,KEY=VALUE] form (vLLM 0.9
    and before: keys lowercased, integer counts)."""
    if value.lstrip().startswith(("{", "[")):
        try:
            return json.loads(value)
        except ValueError:
            raise ConfigError(
                f"--limit-mm-per-prompt must be JSON such as {_LIMIT_EXAMPLE}, got {value!r}"
            ) from None
    out = {}
    for item in value.split(","):
        key, sep, count = (part.strip() for part in item.partition("="))
        if not sep or not key or not count.lstrip("-").isdigit():
            raise ConfigError(
                f"--limit-mm-per-prompt must be JSON such as {_LIMIT_EXAMPLE} (or image=4), got {value!r}"
            )
        out[key.lower()] = int(count)
    return out


def _count(modality: str, limit) -> object:
    """The count of one modality's entry: an integer, or vLLM's {"count": N, "width": W, "height": H}."""
    if not isinstance(limit, dict):
        return limit
    unknown = sorted(set(limit) - set(_IMAGE_LIMIT_OPTIONS))
    if unknown:
        raise ConfigError(
            f"--limit-mm-per-prompt: {modality!r} takes {', '.join(_IMAGE_LIMIT_OPTIONS)}, "
            f"not {', '.join(map(repr, unknown))}"
        )
    return limit.get("count")


def parse_image_limit(value: str | dict | None) -> int:
    """The most images one request may carry, from --limit-mm-per-prompt's text or mapping (ConfigError
    if malformed)."""
    if value is None:
        return DEFAULT_IMAGE_LIMIT
    if isinstance(value, str):
        value = _limit_mapping(value)
    if not isinstance(value, dict):
        raise ConfigError(f"--limit-mm-per-prompt must be a JSON object such as {_LIMIT_EXAMPLE}")
    counts = {}
    for modality, limit in value.items():
        count = _count(modality, limit)
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ConfigError(
                f"--limit-mm-per-prompt: {modality!r} needs a count of 0 or more, got {limit!r}"
            )
        if modality != "image" and count > 0:
            raise ConfigError(
                f"--limit-mm-per-prompt: {modality!r} inputs are not supported; only images are"
            )
        counts[modality] = count
    return counts.get("image", DEFAULT_IMAGE_LIMIT)
