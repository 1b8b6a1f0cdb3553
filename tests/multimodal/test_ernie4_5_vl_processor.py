"""fd's ERNIE-4.5-VL image processor against transformers' (the PIL backend: torchvision is not
installed): pixel rows within 1e-5, grid_thw and placeholder counts equal, and the token expansion."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.multimodal.ernie4_5_vl_processor import Ernie4_5_VLImageProcessor, image_content_hash
from fdcli_engine.multimodal.patches import smart_resize

CONFIG = {"image_token_id": 7, "image_start_token_id": 5, "image_end_token_id": 6, "vision_config": {}}


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


@pytest.mark.parametrize(
    ("size", "mode", "hf_kwargs", "fd_kwargs"),
    [
        ((448, 448), "RGB", {}, None),
        ((200, 97), "RGB", {}, None),  # rounding up to multiples of 28
        ((30, 40), "RGBA", {}, None),  # below min_pixels: scaled up; alpha dropped
        (
            (1000, 700),
            "L",
            {"size": {"shortest_edge": 3136, "longest_edge": 28 * 28 * 100}},
            {"max_pixels": 28 * 28 * 100},
        ),  # over max_pixels: scaled down
        (
            (320, 240),
            "RGB",
            {"size": {"shortest_edge": 28 * 28 * 300, "longest_edge": 28 * 28 * 400}},
            {"size": {"shortest_edge": 28 * 28 * 300, "longest_edge": 28 * 28 * 400}},
        ),
    ],
)
def test_pixels_and_grid_match_transformers(size, mode, hf_kwargs, fd_kwargs):
    image = _picture(*size, mode=mode)
    hf = _hf(**hf_kwargs)
    ref = hf(images=[image.convert("RGB") if mode == "L" else image], return_tensors="np")
    rows, grid = Ernie4_5_VLImageProcessor(CONFIG).preprocess(
        image if mode != "L" else image.convert("RGB"), fd_kwargs
    )
    assert grid == ref["image_grid_thw"][0].tolist()
    assert rows.shape == ref["pixel_values"].shape
    np.testing.assert_allclose(rows, ref["pixel_values"], rtol=0, atol=1e-5)
    num_patches = hf.get_number_of_image_patches(size[1], size[0], hf_kwargs)
    assert Ernie4_5_VLImageProcessor(CONFIG).num_tokens(grid) == num_patches // hf.merge_size**2


def test_smart_resize_matches_transformers():
    from transformers.models.ernie4_5_vl_moe.image_processing_pil_ernie4_5_vl_moe import (
        smart_resize as hf_resize,
    )

    for h, w in [(2, 300), (28, 28), (999, 17), (4000, 3000), (56, 56 * 150)]:
        assert smart_resize(h, w, 28, 3136, 28 * 28 * 6177) == hf_resize(h, w, 28, 3136, 28 * 28 * 6177)
    for fn in (smart_resize, hf_resize):
        with pytest.raises(ValueError, match="aspect ratio"):
            fn(1, 300, 28, 3136, 28 * 28 * 6177)


def test_process_expands_each_placeholder():
    proc = Ernie4_5_VLImageProcessor(CONFIG)
    a, b = _picture(56, 84, seed=1), _picture(112, 56, seed=2)
    prompt = [1, 5, 7, 6, 9, 5, 7, 6, 2]
    ids, feats = proc.process(prompt, [a, b])
    assert [f.grid_thw for f in feats] == [[1, 6, 4], [1, 4, 8]]
    n0, n1 = 6 * 4 // 4, 4 * 8 // 4
    assert ids == [1, 5] + [7] * n0 + [6, 9, 5] + [7] * n1 + [6, 2]
    assert (feats[0].offset, feats[0].length) == (2, n0)
    assert (feats[1].offset, feats[1].length) == (2 + n0 + 3, n1)
    assert all(ids[f.offset + i] == 7 for f in feats for i in range(f.length))
    ref = _hf()(images=[a, b], return_tensors="np")["pixel_values"]
    np.testing.assert_allclose(np.concatenate([f.pixels() for f in feats]), ref, rtol=0, atol=1e-5)
    assert feats[0].content_hash == image_content_hash(a) != feats[1].content_hash


def test_bad_requests_are_invalid_request_errors():
    proc = Ernie4_5_VLImageProcessor(CONFIG)
    with pytest.raises(InvalidRequestError, match="1 image placeholder"):
        proc.process([5, 7, 6], [_picture(56, 56), _picture(56, 56)])
    with pytest.raises(InvalidRequestError, match="unknown key 'image_sizes'") as err:
        proc.process([5, 7, 6], [_picture(56, 56)], {"image_sizes": 3})
    assert err.value.param == "mm_processor_kwargs"
    with pytest.raises(InvalidRequestError, match="min_pixels is larger"):
        proc.process([5, 7, 6], [_picture(56, 56)], {"min_pixels": 10_000, "max_pixels": 100})
    with pytest.raises(InvalidRequestError, match="aspect ratio"):
        proc.process([5, 7, 6], [_picture(1, 300)])
