"""`--mm-processor-kwargs` (vLLM's and FastDeploy's flag; `LLM(mm_processor_kwargs=...)`): the image
processor's settings for every request, as overrides of the checkpoint's preprocessor_config.json (what
vLLM passes to the processor's from_pretrained). A request's own `mm_processor_kwargs` then work within
them (a request may lower max_pixels, never raise it).

Read under each project's names, one meaning each:
- `min_pixels`, `max_pixels` (transformers / vLLM), `image_min_pixels`, `image_max_pixels` (FastDeploy):
  the pixel budget a picture is resized into;
- `size`: `{"shortest_edge": min_pixels, "longest_edge": max_pixels}` (transformers' newer form).
Any other key (FastDeploy's video_* settings, another processor's options) changes nothing here and is
named in one start-up line, as vLLM drops the overrides its processor does not take.

Leaf module: imports the errors only.
"""

from __future__ import annotations

from typing import Any

from fdcli_engine.errors import ConfigError

# Each name -> the preprocessor_config.json key it sets.
_BUDGET = {
    "min_pixels": "min_pixels",
    "max_pixels": "max_pixels",
    "image_min_pixels": "min_pixels",
    "image_max_pixels": "max_pixels",
}
_SIZE_EDGES = {"shortest_edge": "min_pixels", "longest_edge": "max_pixels"}


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"--mm-processor-kwargs: {name} must be a positive integer, got {value!r}")
    return value


def _set(out: dict, names: dict, key: str, name: str, value: int) -> None:
    if key in out and out[key] != value:
        raise ConfigError(f"--mm-processor-kwargs: {names[key]} and {name} are one setting; they disagree")
    out[key], names[key] = value, name


def processor_overrides(kwargs: dict | None) -> tuple[dict, list[str]]:
    """(preprocessor_config.json overrides, the given keys that change nothing here); a ConfigError
    for a bad value."""
    if not kwargs:
        return {}, []
    if not isinstance(kwargs, dict):
        raise ConfigError(f"--mm-processor-kwargs must be a JSON object, got {kwargs!r}")
    out: dict[str, int] = {}
    names: dict[str, str] = {}
    ignored = []
    for name, value in kwargs.items():
        if name in _BUDGET:
            _set(out, names, _BUDGET[name], name, _positive(name, value))
        elif name == "size" and isinstance(value, dict) and set(value) <= set(_SIZE_EDGES):
            for edge, v in value.items():
                _set(out, names, _SIZE_EDGES[edge], f"size.{edge}", _positive(f"size.{edge}", v))
        else:
            ignored.append(name)
    if out.get("min_pixels", 0) > out.get("max_pixels", float("inf")):
        raise ConfigError(
            f"--mm-processor-kwargs: {names['min_pixels']} {out['min_pixels']} exceeds "
            f"{names['max_pixels']} {out['max_pixels']}"
        )
    return out, ignored


def processor_notes(kwargs: dict | None, multimodal: bool) -> list[str]:
    """The start-up lines for what --mm-processor-kwargs does not do on this model."""
    if not kwargs:
        return []
    if not multimodal:
        return ["--mm-processor-kwargs has no effect: the model is text-only (it takes no images)"]
    _, ignored = processor_overrides(kwargs)
    if not ignored:
        return []
    return [
        f"--mm-processor-kwargs {', '.join(ignored)}: no effect (fd's image processors read min_pixels / "
        "max_pixels, image_min_pixels / image_max_pixels or size only, and fd takes no videos)"
    ]
