"""Qwen2.5-VL pooling models with images through the in-process EngineCore, against transformers: the
body's last hidden state (--convert embed, LAST pooling) and a reward head over it (tests/tiny_vl.py)."""

from __future__ import annotations

import numpy as np
import pooling_models
import pytest
import tiny_vl

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PROMPT = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>hello world<|im_end|>\n"
ATOL = 1e-4


def _hf_hidden(folder, ids, image):
    model = transformers.Qwen2_5_VLModel.from_pretrained(folder, attn_implementation="eager").eval()
    ip = transformers.Qwen2VLImageProcessorPil.from_pretrained(folder)
    pp = ip(images=[image], return_tensors="pt")
    t = torch.tensor([ids])
    with torch.no_grad():
        out = model(
            input_ids=t,
            attention_mask=torch.ones_like(t),
            pixel_values=pp["pixel_values"],
            image_grid_thw=pp["image_grid_thw"],
            mm_token_type_ids=(t == model.config.image_token_id).int(),
        )
    return out.last_hidden_state[0].numpy()


@pytest.fixture(scope="module")
def images():
    return [tiny_vl.random_image(168, 112, seed=1), tiny_vl.random_image(84, 56, seed=2)]


def test_convert_embed_with_images_matches_transformers(tmp_path, images):
    folder = tiny_vl.make_tiny_qwen2_5_vl(tmp_path / "vl")
    ids, pools = pooling_models.pool_images(folder, PROMPT, images, runner="pooling", convert="embed")
    for p, raw, image in zip(ids, pools, images):
        np.testing.assert_allclose(raw, _hf_hidden(folder, p, image)[-1], atol=ATOL, rtol=0)
    assert not np.allclose(pools[0], pools[1], atol=1e-3)  # the picture changes the vector


def test_reward_head_with_images_matches_transformers(tmp_path, images):
    folder = tiny_vl.make_tiny_qwen2_5_vl_reward(tmp_path / "rm")
    ids, pools = pooling_models.pool_images(folder, PROMPT, images)
    for p, raw, image in zip(ids, pools, images):
        h = _hf_hidden(folder, p, image).astype(np.float64)  # reward pools ALL: a score per token
        want = pooling_models.reference_score_head(folder, h)
        np.testing.assert_allclose(raw, want, atol=ATOL, rtol=0)
