"""--mm-processor-kwargs under vLLM's (transformers') and FastDeploy's names: each sets the checkpoint's
pixel budget for every request, checked before the model loads; keys fd's processors do not read are
named in one start-up line (vLLM drops the overrides its processor does not take)."""

from __future__ import annotations

import pytest
import tiny_vl

from fdcli_engine.config import EngineConfig
from fdcli_engine.errors import ConfigError
from fdcli_engine.loader import read_model_config
from fdcli_engine.multimodal.processor import get_image_processor
from fdcli_engine.multimodal.processor_overrides import processor_notes, processor_overrides


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_pixels": 3136, "max_pixels": 200704},  # vLLM's Qwen2.5-VL recipes
        {"image_min_pixels": 3136, "image_max_pixels": 200704},  # FastDeploy's ERNIE-4.5-VL lines
        {"size": {"shortest_edge": 3136, "longest_edge": 200704}},  # transformers' newer form
    ],
)
def test_names_set_the_pixel_budget(tiny_qwen_vl, kwargs):
    proc = get_image_processor(read_model_config(tiny_qwen_vl), tiny_qwen_vl, kwargs)
    assert (proc.min_pixels, proc.max_pixels) == (3136, 200704)
    default = get_image_processor(read_model_config(tiny_qwen_vl), tiny_qwen_vl)
    assert (default.min_pixels, default.max_pixels) == (tiny_vl.MIN_PIXELS, tiny_vl.MAX_PIXELS)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"max_pixels": 0}, "max_pixels must be a positive integer"),
        ({"image_max_pixels": "big"}, "image_max_pixels must be a positive integer"),
        ({"max_pixels": 100, "image_max_pixels": 200}, "max_pixels and image_max_pixels are one setting"),
        ({"min_pixels": 800, "max_pixels": 100}, "min_pixels 800 exceeds max_pixels 100"),
    ],
)
def test_bad_values_stop_the_start(kwargs, words):
    with pytest.raises(ConfigError, match=words):
        EngineConfig.from_dict({"mm_processor_kwargs": kwargs}).validate()


def test_keys_without_effect_are_named():
    assert processor_overrides({"max_pixels": 100, "video_max_frames": 8}) == (
        {"max_pixels": 100},
        ["video_max_frames"],
    )
    (line,) = processor_notes({"max_pixels": 100, "video_max_frames": 8}, multimodal=True)
    assert line.startswith("--mm-processor-kwargs video_max_frames: no effect")
    (line,) = processor_notes({"max_pixels": 100}, multimodal=False)
    assert "the model is text-only" in line
    assert processor_notes({"max_pixels": 100}, multimodal=True) == []


def test_a_bound_past_the_checkpoints_other_one_stops_the_start(tiny_qwen_vl):
    from fdcli_engine.config_resolver import resolve_config

    too_big = {"min_pixels": tiny_vl.MAX_PIXELS * 2}  # the checkpoint's max_pixels stays
    with pytest.raises(ConfigError, match=f"min_pixels {too_big['min_pixels']} exceeds max_pixels"):
        resolve_config(EngineConfig.from_dict({"model": str(tiny_qwen_vl), "mm_processor_kwargs": too_big}))
