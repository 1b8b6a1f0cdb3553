"""fd's ERNIE-4.5-VL image processor against transformers' (the PIL backend: torchvision is not
installed): pixel rows within 1e-5, grid_thw and placeholder counts equal, and the token expansion."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from tiny_ernie_vl import ERNIE_VL_ARCH

from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.multimodal.ernie4_5_vl_processor import Ernie4_5_VLImageProcessor
from fdcli_engine.multimodal.image_input import pil_content_hash
from fdcli_engine.multimodal.processor import get_image_processor

CONFIG = {"architectures": [ERNIE_VL_ARCH], "image_token_id": 7, "vision_config": {"patch_size": 14}}


def _picture(width: int, height: int, seed: int = 0, mode: str = "RGB") -> Image.Image:
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    arr = rng.integers(0, 256, size=(height, width, channels), dtype=np.uint8)
    return Image.fromarray(arr.squeeze(-1) if channels == 1 else arr, mode=mode)


def _hf(**kwargs):
    from transformers.models.ernie4_5_vl_moe.image_processing_pil_ernie4_5_vl_moe import (
        Ernie4_5_VLMoeImageProcessorPil,
    )

    return Ernie4_5_VLMoeImageProcessorPil(**kwargs)


@pytest.fixture(scope="module")
def proc():
    p = get_image_processor(CONFIG)
    assert isinstance(p, Ernie4_5_VLImageProcessor)
    return p


@pytest.mark.parametrize(
    ("size", "mode", "max_pixels"),
    [
        ((448, 448), "RGB", None),
        ((200, 97), "RGB", None),  # rounded to multiples of 28
        ((30, 40), "RGBA", None),  # below min_pixels: scaled up; alpha composited onto white
        ((1000, 700), "L", 28 * 28 * 100),  # over max_pixels: scaled down
    ],
)
def test_pixels_and_grid_match_transformers(proc, size, mode, max_pixels):
    image = _picture(*size, mode=mode)
    hf_kwargs = {"size": {"shortest_edge": 56 * 56, "longest_edge": max_pixels}} if max_pixels else {}
    hf = _hf(**hf_kwargs)
    ref = hf(images=[image], return_tensors="np")
    kwargs = {"max_pixels": max_pixels} if max_pixels else None
    _, (feat,) = proc.process([1, 7, 2], [image], kwargs)
    assert feat.grid_thw == ref["image_grid_thw"][0].tolist()
    assert feat.pixel_shape == list(ref["pixel_values"].shape)
    np.testing.assert_allclose(feat.pixels(), ref["pixel_values"], rtol=0, atol=1e-5)
    num_patches = hf.get_number_of_image_patches(size[1], size[0], hf_kwargs)
    assert feat.length == num_patches // hf.merge_size**2


def test_default_budget_is_ernies(proc):
    hf = _hf()
    assert (proc.min_pixels, proc.max_pixels) == (hf.size["shortest_edge"], hf.size["longest_edge"])
    assert proc.temporal_patch_size == 1 and proc.patch_size == 14 and proc.merge_size == 2


def test_process_expands_each_placeholder(proc):
    a, b = _picture(56, 84, seed=1), _picture(112, 56, seed=2)
    prompt = [1, 5, 7, 6, 9, 5, 7, 6, 2]
    ids, feats = proc.process(prompt, [a, b])
    assert [f.grid_thw for f in feats] == [[1, 6, 4], [1, 4, 8]]
    n0, n1 = 6 * 4 // 4, 4 * 8 // 4
    assert ids == [1, 5] + [7] * n0 + [6, 9, 5] + [7] * n1 + [6, 2]
    assert (feats[0].offset, feats[0].length) == (2, n0)
    assert (feats[1].offset, feats[1].length) == (2 + n0 + 3, n1)
    ref = _hf()(images=[a, b], return_tensors="np")["pixel_values"]
    np.testing.assert_allclose(np.concatenate([f.pixels() for f in feats]), ref, rtol=0, atol=1e-5)
    assert feats[0].content_hash == pil_content_hash(a) != feats[1].content_hash


def test_bad_requests_are_invalid_request_errors(proc):
    with pytest.raises(InvalidRequestError, match="1 image placeholder"):
        proc.process([5, 7, 6], [_picture(56, 56), _picture(56, 56)])
    with pytest.raises(InvalidRequestError, match="unknown key") as err:
        proc.process([5, 7, 6], [_picture(56, 56)], {"image_sizes": 3})
    assert err.value.param == "mm_processor_kwargs"
    with pytest.raises(InvalidRequestError, match="aspect ratio"):
        proc.process([5, 7, 6], [_picture(1, 300)])
