"""ERNIE-4.5-VL pooling models with images through the in-process EngineCore, against transformers:
the body's last hidden state (--convert embed, LAST pooling) and a reward head over every token
(tests/tiny_ernie_vl.py)."""

from __future__ import annotations

import numpy as np
import pooling_models
import pytest
from tiny_ernie_vl import (
    hf_image_kwargs,
    hf_pixels,
    load_hf_ernie_vl,
    make_tiny_ernie_vl,
    make_tiny_ernie_vl_reward,
)
from tiny_models import random_image

torch = pytest.importorskip("torch")

PROMPT = "<|im_start|>user\n<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>hello world<|im_end|>\n"
ATOL = 1e-4


@pytest.fixture(scope="module")
def images():
    return [random_image(112, 84, 1), random_image(56, 56, 2)]


def _hf_hidden(folder, ids, image):
    model = load_hf_ernie_vl(folder).model
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), **hf_image_kwargs(ids, hf_pixels([image])))
    return out.last_hidden_state[0].numpy()


def test_convert_embed_with_images_matches_transformers(tmp_path, images):
    folder = make_tiny_ernie_vl(tmp_path / "vl")
    ids, pools = pooling_models.pool_images(folder, PROMPT, images, runner="pooling", convert="embed")
    for p, raw, image in zip(ids, pools, images, strict=True):
        np.testing.assert_allclose(raw, _hf_hidden(folder, p, image)[-1], atol=ATOL, rtol=0)
    assert not np.allclose(pools[0], pools[1], atol=1e-3)  # the picture changes the vector


def test_reward_head_with_images_matches_transformers(tmp_path, images):
    folder = make_tiny_ernie_vl_reward(tmp_path / "rm")
    ids, pools = pooling_models.pool_images(folder, PROMPT, images)
    for p, raw, image in zip(ids, pools, images, strict=True):
        h = _hf_hidden(folder, p, image).astype(np.float64)  # reward pools ALL: a score per token
        want = pooling_models.reference_score_head(folder, h)
        np.testing.assert_allclose(raw, want, atol=ATOL, rtol=0)
