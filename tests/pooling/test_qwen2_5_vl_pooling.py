"""Qwen2.5-VL pooling models with images through the in-process EngineCore, against transformers: the
body's last hidden state (--convert embed, LAST pooling) and a reward head over it (tests/tiny_vl.py)."""

from __future__ import annotations

import numpy as np
import pytest
import tiny_vl

from fdcli_engine.config import EngineConfig
from fdcli_engine.config_resolver import resolve_config
from fdcli_engine.multimodal.processor import get_image_processor

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PROMPT = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>hello world<|im_end|>\n"
ATOL = 1e-4


def _pool(folder, images_per_request, **options):
    """Raw pooled vectors of PROMPT with each request's image, and the expanded ids."""
    from fdcli_engine.engine import EngineCore, EngineCoreRequest
    from fdcli_engine.pooling_params import PoolingParams
    from fdcli_engine.tokenizer import load_tokenizer

    config = resolve_config(EngineConfig(model=str(folder), max_num_seqs=4, max_model_len=256, **options))
    core = EngineCore(config)
    proc = get_image_processor(config.hf_config, config.model_path)
    base = load_tokenizer(config).encode(PROMPT)
    ids = []
    for i, image in enumerate(images_per_request):
        p, feats = proc.process(base, [image])
        ids.append(p)
        core.add_request(EngineCoreRequest(f"r{i}", p, pooling_params=PoolingParams(), mm_features=feats))
    pooled = {}
    while core.has_unfinished_requests():
        for out in core.step():
            pooled[out.req_id] = np.asarray(out.pooled, dtype=np.float32)
    assert not core.runner.mm._states
    return ids, [pooled[f"r{i}"] for i in range(len(ids))]


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
    ids, pools = _pool(folder, images, runner="pooling", convert="embed")
    for p, raw, image in zip(ids, pools, images):
        np.testing.assert_allclose(raw, _hf_hidden(folder, p, image)[-1], atol=ATOL, rtol=0)
    assert not np.allclose(pools[0], pools[1], atol=1e-3)  # the picture changes the vector


def test_reward_head_with_images_matches_transformers(tmp_path, images):
    from safetensors.numpy import load_file

    folder = tiny_vl.make_tiny_qwen2_5_vl_reward(tmp_path / "rm")
    ids, pools = _pool(folder, images)
    w = load_file(str(folder / "model.safetensors"))
    for p, raw, image in zip(ids, pools, images):
        h = _hf_hidden(folder, p, image).astype(np.float64)  # reward pools ALL: a score per token
        want = (
            np.maximum(h @ w["score.0.weight"].T + w["score.0.bias"], 0) @ w["score.2.weight"].T
            + w["score.2.bias"]
        )
        np.testing.assert_allclose(raw, want, atol=ATOL, rtol=0)
