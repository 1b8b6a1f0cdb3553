"""`--limit-mm-per-prompt` (vLLM's; `LLM(limit_mm_per_prompt=...)`): the most images one request may
carry. vLLM's forms: JSON `{"image": 4}`, its configurable `{"image": {"count": 4, "width": W, "height":
H}}` and the older `image=4`. Other modalities' counts (FastDeploy's ERNIE-4.5-VL lines give videos
100) change nothing and are named in one start-up line: a request with such a part is a 400.

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
    """The count of one modality's entry: an integer, or vLLM's {"count": N, "width": W, "height": H}
    (another modality's options beside the count change nothing here: it is not read)."""
    if not isinstance(limit, dict):
        return limit
    unknown = sorted(set(limit) - set(_IMAGE_LIMIT_OPTIONS)) if modality == "image" else []
    if unknown:
        raise ConfigError(
            f"--limit-mm-per-prompt: {modality!r} takes {', '.join(_IMAGE_LIMIT_OPTIONS)}, "
            f"not {', '.join(map(repr, unknown))}"
        )
    return limit.get("count")


def _counts(value: str | dict) -> dict[str, int]:
    """Each modality's count (ConfigError if malformed)."""
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
        counts[modality] = count
    return counts


def parse_image_limit(value: str | dict | None) -> int:
    """The most images one request may carry, from --limit-mm-per-prompt's text or mapping (ConfigError
    if malformed)."""
    return DEFAULT_IMAGE_LIMIT if value is None else _counts(value).get("image", DEFAULT_IMAGE_LIMIT)


def limit_notes(value: str | dict | None) -> list[str]:
    """The start-up line for the modalities fd does not read (FastDeploy's ERNIE-4.5-VL lines give
    videos 100): their counts change nothing, since such a part is a 400 naming what to send."""
    other = [
        f"{m} {n}" for m, n in (_counts(value) if value is not None else {}).items() if m != "image" and n > 0
    ]
    if not other:
        return []
    return [
        f"--limit-mm-per-prompt {', '.join(other)}: no effect (fd reads images only; a request with "
        "another media part is refused)"
    ]
