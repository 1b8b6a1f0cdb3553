"""ERNIE-4.5-VL pooling models with images through the in-process EngineCore, against transformers:
the body's last hidden state (--convert embed, LAST pooling) and a reward head over every token
(tests/tiny_ernie_vl.py)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from tiny_ernie_vl import ERNIE_VL_TOKENS, load_hf_ernie_vl, make_tiny_ernie_vl, make_tiny_ernie_vl_reward

from fdcli_engine.config import EngineConfig
from fdcli_engine.config_resolver import resolve_config
from fdcli_engine.multimodal.processor import get_image_processor

torch = pytest.importorskip("torch")

PROMPT = "<|im_start|>user\n<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>hello world<|im_end|>\n"
START, END, IMG = (
    ERNIE_VL_TOKENS[k] for k in ("image_start_token_id", "image_end_token_id", "image_token_id")
)
ATOL = 1e-4


def picture(width, height, seed):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def images():
    return [picture(112, 84, 1), picture(56, 56, 2)]


def _pool(folder, images, **options):
    """(expanded ids, raw pooled output) per request, each request PROMPT with one of `images`."""
    from fdcli_engine.engine import EngineCore, EngineCoreRequest
    from fdcli_engine.pooling_params import PoolingParams
    from fdcli_engine.tokenizer import load_tokenizer

    config = resolve_config(EngineConfig(model=str(folder), max_num_seqs=4, max_model_len=256, **options))
    core = EngineCore(config)
    proc = get_image_processor(config.hf_config, config.model_path)
    base = load_tokenizer(config).encode(PROMPT)
    ids = []
    for i, image in enumerate(images):
        p, feats = proc.process(base, [image])
        ids.append(p)
        core.add_request(EngineCoreRequest(f"r{i}", p, pooling_params=PoolingParams(), mm_features=feats))
    pooled = {}
    while core.has_unfinished_requests():
        for out in core.step():
            pooled[out.req_id] = np.asarray(out.pooled, dtype=np.float32)
    return ids, [pooled[f"r{i}"] for i in range(len(ids))]


def _hf_hidden(folder, ids, image):
    from transformers.models.ernie4_5_vl_moe.image_processing_pil_ernie4_5_vl_moe import (
        Ernie4_5_VLMoeImageProcessorPil,
    )

    model = load_hf_ernie_vl(folder).model
    px = Ernie4_5_VLMoeImageProcessorPil()(images=[image], return_tensors="pt")
    t = torch.tensor([ids])
    with torch.no_grad():
        out = model(
            input_ids=t,
            pixel_values=px["pixel_values"],
            image_grid_thw=px["image_grid_thw"],
            mm_token_type_ids=(t == IMG).int(),
            moe_mm_token_type_ids=((t == IMG) | (t == START) | (t == END)).int(),
        )
    return out.last_hidden_state[0].numpy()


def test_convert_embed_with_images_matches_transformers(tmp_path, images):
    folder = make_tiny_ernie_vl(tmp_path / "vl")
    ids, pools = _pool(folder, images, runner="pooling", convert="embed")
    for p, raw, image in zip(ids, pools, images, strict=True):
        np.testing.assert_allclose(raw, _hf_hidden(folder, p, image)[-1], atol=ATOL, rtol=0)
    assert not np.allclose(pools[0], pools[1], atol=1e-3)  # the picture changes the vector


def test_reward_head_with_images_matches_transformers(tmp_path, images):
    from safetensors.numpy import load_file

    folder = make_tiny_ernie_vl_reward(tmp_path / "rm")
    ids, pools = _pool(folder, images)
    w = load_file(str(folder / "model.safetensors"))
    for p, raw, image in zip(ids, pools, images, strict=True):
        h = _hf_hidden(folder, p, image).astype(np.float64)  # reward pools ALL: a score per token
        want = (
            np.maximum(h @ w["score.0.weight"].T + w["score.0.bias"], 0) @ w["score.2.weight"].T
            + w["score.2.bias"]
        )
        np.testing.assert_allclose(raw, want, atol=ATOL, rtol=0)
