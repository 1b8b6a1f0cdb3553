"""fd's Qwen2-VL image processor against transformers' (the PIL backend: Pillow's bicubic resize, as
fd's): pixel rows and grid within 1e-5, and the placeholder expansion by transformers' own rule."""

from __future__ import annotations

import types

import numpy as np
import pytest
import tiny_vl

from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.loader import read_model_config
from fdcli_engine.multimodal.image_input import pil_content_hash
from fdcli_engine.multimodal.processor import get_image_processor, read_preprocessor_config

transformers = pytest.importorskip("transformers")

# (width, height): kept as is, upscaled to min_pixels, downscaled to max_pixels, odd sizes rounded.
SIZES = [(84, 56), (20, 30), (300, 200), (61, 97), (28, 280)]


@pytest.fixture(scope="module")
def fd_proc(tiny_qwen_vl):
    return get_image_processor(read_model_config(tiny_qwen_vl), tiny_qwen_vl)


@pytest.fixture(scope="module")
def hf_image_processor(tiny_qwen_vl):
    return transformers.Qwen2VLImageProcessorPil.from_pretrained(tiny_qwen_vl)


@pytest.mark.parametrize("size", SIZES)
def test_pixels_and_grid_match_transformers(fd_proc, hf_image_processor, size):
    image = tiny_vl.random_image(*size, seed=sum(size))
    want = hf_image_processor(images=[image], return_tensors="np")
    rows, grid = fd_proc.pixel_values(image, fd_proc.min_pixels, fd_proc.max_pixels)
    assert grid == want["image_grid_thw"][0].tolist()
    assert rows.shape == want["pixel_values"].shape
    np.testing.assert_allclose(rows, want["pixel_values"], atol=1e-5, rtol=0)


def test_min_max_pixels_kwargs_match_transformers(fd_proc, tiny_qwen_vl):
    image = tiny_vl.random_image(300, 200, seed=3)
    hf = transformers.Qwen2VLImageProcessorPil.from_pretrained(tiny_qwen_vl, max_pixels=28 * 28 * 4)
    want = hf(images=[image], return_tensors="np")
    ids, feats = fd_proc.process([5, fd_proc.image_token_id, 6], [image], {"max_pixels": 28 * 28 * 4})
    assert feats[0].grid_thw == want["image_grid_thw"][0].tolist()
    np.testing.assert_allclose(feats[0].pixels(), want["pixel_values"], atol=1e-5, rtol=0)


def test_image_size_sets_the_area(fd_proc):
    image = tiny_vl.random_image(300, 200, seed=4)
    _, feats = fd_proc.process([fd_proc.image_token_id], [image], {"image_size": 56})
    t, h, w = feats[0].grid_thw
    # about 56 x 56 pixels of area in 28-pixel steps, the aspect ratio kept as far as those allow
    assert (h * 14, w * 14) == (28, 56)
    with pytest.raises(InvalidRequestError, match="image_size must be a positive integer"):
        fd_proc.process([fd_proc.image_token_id], [image], {"image_size": "224"})


def test_placeholder_expansion(fd_proc, hf_image_processor, tiny_qwen_vl):
    pad = fd_proc.image_token_id
    a, b = tiny_vl.random_image(84, 56, seed=1), tiny_vl.random_image(300, 200, seed=2)
    prompt = [1, 300, pad, 301, 7, 8, 300, pad, 301, 9]
    ids, feats = fd_proc.process(prompt, [a, b])
    # transformers' rule (Qwen2_5_VLProcessor.replace_image_token): grid_t*grid_h*grid_w / merge^2 pads.
    stub = types.SimpleNamespace(image_processor=hf_image_processor, image_token="<|image_pad|>")
    grids = hf_image_processor(images=[a, b], return_tensors="np")["image_grid_thw"]
    counts = [
        transformers.Qwen2_5_VLProcessor.replace_image_token(stub, {"image_grid_thw": grids}, i).count(
            "<|image_pad|>"
        )
        for i in range(2)
    ]
    assert [f.length for f in feats] == counts
    assert ids == [1, 300] + [pad] * counts[0] + [301, 7, 8, 300] + [pad] * counts[1] + [301, 9]
    assert [f.offset for f in feats] == [2, 2 + counts[0] + 4]
    assert feats[0].content_hash == pil_content_hash(a) != feats[1].content_hash
    assert all(ids[f.offset : f.end] == [pad] * f.length for f in feats)


def test_bad_requests_are_invalid(fd_proc):
    image = tiny_vl.random_image(84, 56)
    pad = fd_proc.image_token_id
    with pytest.raises(InvalidRequestError, match="1 image placeholder"):
        fd_proc.process([1, pad], [image, image])
    with pytest.raises(InvalidRequestError, match="unknown key"):
        fd_proc.process([1, pad], [image], {"resized_height": 3})
    with pytest.raises(InvalidRequestError, match="min_pixels exceeds"):
        fd_proc.process([1, pad], [image], {"min_pixels": 10_000, "max_pixels": 100})
    with pytest.raises(InvalidRequestError, match="aspect ratio"):
        fd_proc.process([1, pad], [tiny_vl.random_image(5000, 10)])


def test_text_only_model_has_no_processor(tmp_path):
    assert get_image_processor({"architectures": ["Qwen2ForCausalLM"]}, tmp_path) is None
    assert read_preprocessor_config(tmp_path) is None


def test_config_keeps_vision_settings(tiny_qwen_vl, fd_proc):
    cfg = read_model_config(tiny_qwen_vl)
    assert cfg["hidden_size"] == 64 and cfg["vision_config"]["depth"] == 3
    tok = transformers.AutoTokenizer.from_pretrained(tiny_qwen_vl)
    assert fd_proc.image_token_id == cfg["image_token_id"] == tok.convert_tokens_to_ids("<|image_pad|>")


def _translucent(seed: int, alpha_seed: int):
    rgb = np.asarray(tiny_vl.random_image(56, 84, seed=seed))
    alpha = np.random.default_rng(alpha_seed).integers(0, 256, rgb.shape[:2], dtype=np.uint8)
    from PIL import Image

    return Image.fromarray(np.dstack([rgb, alpha]), "RGBA")


def test_transparency_is_composited_onto_white_as_transformers_does(fd_proc, hf_image_processor):
    image = _translucent(7, 8)
    want = hf_image_processor(images=[image], return_tensors="np")
    rows, _ = fd_proc.pixel_values(image, fd_proc.min_pixels, fd_proc.max_pixels)
    np.testing.assert_allclose(rows, want["pixel_values"], atol=1e-5, rtol=0)


def test_served_and_offline_pictures_hash_and_process_alike(fd_proc):
    """A translucent PNG sent as a data: URL decodes to the pixels the offline path processes, with the
    same hash; the same colours under another alpha are another picture to the prefix cache."""
    import base64
    import io

    from fdcli_engine.multimodal.media import MediaPolicy, load_image

    image = _translucent(7, 8)
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    loaded = load_image(url, MediaPolicy(), param="messages[0].content[0]")
    assert loaded.content_hash == pil_content_hash(image)
    served, _ = fd_proc.pixel_values(loaded.image, fd_proc.min_pixels, fd_proc.max_pixels)
    offline, _ = fd_proc.pixel_values(image, fd_proc.min_pixels, fd_proc.max_pixels)
    np.testing.assert_array_equal(served, offline)
    assert pil_content_hash(_translucent(7, 9)) != pil_content_hash(image)
