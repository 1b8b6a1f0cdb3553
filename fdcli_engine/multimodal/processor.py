"""Which image processor a model takes, chosen by its architecture.

`get_image_processor(hf_config, model_dir, mm_processor_kwargs)` returns None for a text-only model. An ImageProcessor has
`process(prompt_token_ids, images, mm_processor_kwargs) -> (prompt_token_ids, [MultiModalFeature])`
(MM_CONTRACT: one placeholder token per image in, each image's full run of placeholders out).
Another architecture registers its processor in IMAGE_PROCESSORS.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

from fdcli_engine.errors import ConfigError
from fdcli_engine.multimodal.ernie4_5_vl_processor import Ernie4_5_VLImageProcessor
from fdcli_engine.multimodal.inputs import MultiModalFeature
from fdcli_engine.multimodal.processor_overrides import processor_overrides
from fdcli_engine.multimodal.qwen2_vl_processor import Qwen2VLImageProcessor


class ImageProcessor(Protocol):
    def process(
        self, prompt_token_ids: list[int], images: list, mm_processor_kwargs: dict | None = None
    ) -> tuple[list[int], list[MultiModalFeature]]: ...


# architectures[0] prefix -> constructor(hf_config, preprocessor_config dict or None). A prefix covers the
# generative model and the pooling heads over its body (Qwen2_5_VLForRewardModel...).
IMAGE_PROCESSORS = {
    "Ernie4_5_VLMoe": Ernie4_5_VLImageProcessor,
    "Qwen2VL": Qwen2VLImageProcessor,
    "Qwen2_5_VL": Qwen2VLImageProcessor,
}


def _constructor(hf_config: dict):
    archs = hf_config.get("architectures") or []
    arch = str(archs[0]) if archs else ""
    return next((make for prefix, make in IMAGE_PROCESSORS.items() if arch.startswith(prefix)), None)


def is_multimodal_config(hf_config: dict) -> bool:
    return _constructor(hf_config) is not None


def read_preprocessor_config(model_dir) -> dict | None:
    """The checkpoint's preprocessor_config.json (sizes, mean/std), or None where it has none."""
    if model_dir is None:
        return None
    path = Path(model_dir) / "preprocessor_config.json"
    if not path.is_file():
        return None
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return cfg if isinstance(cfg, dict) else None


def get_image_processor(
    hf_config: dict, model_dir=None, mm_processor_kwargs: dict | None = None
) -> ImageProcessor | None:
    """The model's processor; `mm_processor_kwargs` (--mm-processor-kwargs) override its
    preprocessor_config.json (processor_overrides.py)."""
    make = _constructor(hf_config)
    if make is None:
        return None
    overrides, _ = processor_overrides(mm_processor_kwargs)
    return make(hf_config, {**(read_preprocessor_config(model_dir) or {}), **overrides})


def check_processor_overrides(hf_config: dict, model_dir, mm_processor_kwargs: dict | None) -> None:
    """--mm-processor-kwargs against the checkpoint's own budget: one bound given past the other one
    the checkpoint keeps is a ConfigError at start, not a 400 on every request with a picture."""
    proc = get_image_processor(hf_config, model_dir, mm_processor_kwargs) if mm_processor_kwargs else None
    if proc is not None and proc.min_pixels > proc.max_pixels:
        raise ConfigError(
            f"--mm-processor-kwargs: min_pixels {proc.min_pixels} exceeds max_pixels {proc.max_pixels} "
            "(the checkpoint's preprocessor_config.json keeps the one not given)"
        )
