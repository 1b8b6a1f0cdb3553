"""fd's ERNIE-4.5-VL (vision tower, resampler, text/vision experts, 3-D rotary) against transformers'
Ernie4_5_VLMoeForConditionalGeneration on a tiny random checkpoint written by save_pretrained.

Inputs are transformers' image processor output (pixel rows, grid_thw) and the prompt expanded as its
processor expands it (one <|IMAGE_PLACEHOLDER|> per LLM token between <|IMAGE_START|> and
<|IMAGE_END|>). fd runs over the paged KV cache (block_size 4, scattered blocks), fp32, reference ops.
Tolerance: logits within atol 1e-4 (magnitudes ~5; fp32 summation order differs between Paddle and
torch), greedy tokens identical.
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest
import torch
from tiny_ernie_vl import (
    ERNIE_VL_TOKENS,
    VISION,
    hf_image_kwargs,
    hf_pixels,
    load_hf_ernie_vl,
    make_tiny_ernie_vl,
)
from tiny_models import make_attention_metadata, random_image

from fdcli_engine import ops
from fdcli_engine.config import EngineConfig
from fdcli_engine.errors import ModelLoadError
from fdcli_engine.loader import read_model_config
from fdcli_engine.loader.hf import iter_hf_weights
from fdcli_engine.models.ernie4_5_vl import Ernie4_5_VLMoeForConditionalGeneration
from fdcli_engine.models.registry import resolve_model_class
from fdcli_engine.multimodal.inputs import MultiModalFeature

ATOL = 1e-4
START, END, IMG = (
    ERNIE_VL_TOKENS[k] for k in ("image_start_token_id", "image_end_token_id", "image_token_id")
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_ernie_vl(tmp_path_factory.mktemp("ernie_vl"))


@pytest.fixture(scope="module")
def hf(checkpoint):
    return load_hf_ernie_vl(checkpoint)


@pytest.fixture(scope="module")
def fd(checkpoint):
    """Built under the reference ops (the kernels have their own tests); the weights are prepared
    for the backend bound at load time, so the module keeps it bound."""
    previous = ops.backend
    ops.use("reference")
    cfg = read_model_config(checkpoint)
    assert resolve_model_class(cfg) is Ernie4_5_VLMoeForConditionalGeneration
    model = Ernie4_5_VLMoeForConditionalGeneration(cfg, EngineConfig(model=str(checkpoint)))
    model.load_weights(iter_hf_weights(checkpoint))
    yield model
    ops.use(previous)


def hf_inputs(images, text_before, text_after):
    """Pixels and grids from transformers' image processor; the prompt expanded as its processor does."""
    out = hf_pixels(images) if images else None
    ids = list(text_before)
    for grid in out["image_grid_thw"] if out else []:
        ids += [START] + [IMG] * (int(np.prod(grid)) // 4) + [END]
    ids += list(text_after)
    return ids, out


def hf_logits(hf, ids, pixels):
    with torch.no_grad():
        return hf(input_ids=torch.tensor([ids]), **hf_image_kwargs(ids, pixels)).logits[0].numpy()


def features_of(ids, pixels):
    """MultiModalFeatures over transformers' pixel rows, at the placeholder runs of `ids`."""
    if pixels is None:
        return []
    offsets = [i for i in range(len(ids)) if ids[i] == IMG and ids[i - 1] != IMG]
    grids = pixels["image_grid_thw"].tolist()
    sizes = [int(np.prod(g)) for g in grids]
    chunks = np.split(pixels["pixel_values"], np.cumsum(sizes)[:-1])
    return [
        MultiModalFeature.from_pixels("image", str(i), o, n // 4, rows, g)
        for i, (o, n, rows, g) in enumerate(zip(offsets, sizes, chunks, grids, strict=True))
    ]


class VLRunner:
    """One sequence through fd's model in chunks over a paged cache, through the runner's hooks:
    embed_images once, mm_positions once, and each step's placeholder rows as mm_embeds."""

    def __init__(self, model, block_size=4, num_blocks=64):
        self.model, self.block_size = model, block_size
        shape = [num_blocks, model.num_kv_heads, block_size, model.head_dim]
        self.kv = [(paddle.zeros(shape), paddle.zeros(shape)) for _ in range(model.num_layers)]
        self.blocks = [int(b) for b in np.random.default_rng(0).permutation(num_blocks)]

    def prefill(self, ids, pixels, chunks):
        feats = features_of(ids, pixels)
        rows = paddle.concat(self.model.embed_images(feats)).numpy() if feats else None
        self.pos3, self.delta = self.model.mm_positions(ids, feats)
        placeholder = np.cumsum(np.asarray(ids) == IMG) - 1  # image-row index of each placeholder
        logits, done = [], 0
        for n in chunks:
            logits.append(self._step(ids, done, n, rows, placeholder))
            done += n
        self.length = len(ids)
        return np.concatenate(logits)

    def _step(self, ids, start, n, rows, placeholder):
        chunk = np.asarray(ids[start : start + n], dtype=np.int64)
        meta, _ = make_attention_metadata([(start, n, self.blocks)], self.block_size)
        meta.prompt_rows = paddle.to_tensor(np.ones(n, dtype=np.uint8))
        image_rows = np.nonzero(chunk == IMG)[0]
        mm = None
        if rows is not None and image_rows.size:
            mm = (paddle.to_tensor(image_rows), paddle.to_tensor(rows[placeholder[start + image_rows]]))
        positions = paddle.to_tensor(self.pos3[:, start : start + n])
        hidden = self.model.forward(paddle.to_tensor(chunk), positions, self.kv, meta, mm_embeds=mm)
        return self.model.compute_logits(hidden).numpy()

    def decode(self, token):
        meta, positions = make_attention_metadata([(self.length, 1, self.blocks)], self.block_size)
        positions = paddle.to_tensor([self.length + self.delta])  # [T]: every axis the same
        hidden = self.model.forward(paddle.to_tensor([token]), positions, self.kv, meta)
        self.length += 1
        return self.model.compute_logits(hidden).numpy()[-1]


CASES = {
    "one_image": ([random_image(56, 84, 1)], [5, 17, 42], [99, 3, 250, 7]),
    "two_images": ([random_image(112, 56, 2), random_image(56, 56, 3)], [5, 17], [128, 64]),
    "text_only": ([], [5, 17, 42, 99, 3, 250, 7, 128, 64, 311], []),
}


@pytest.mark.parametrize("case", list(CASES))
def test_prefill_logits_match_transformers(case, hf, fd):
    ids, pixels = hf_inputs(*CASES[case])
    want = hf_logits(hf, ids, pixels)
    got = VLRunner(fd).prefill(ids, pixels, [len(ids)])
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)


def test_chunked_prefill_splits_anrandom_image(hf, fd):
    ids, pixels = hf_inputs(*CASES["two_images"])
    first_image = ids.index(IMG)
    chunks = [first_image + 3, 5, len(ids) - first_image - 8]  # the first image's rows split in two steps
    got = VLRunner(fd).prefill(ids, pixels, chunks)
    np.testing.assert_allclose(got, hf_logits(hf, ids, pixels), rtol=0, atol=ATOL)


@pytest.mark.parametrize("case", ["one_image", "text_only"])
def test_greedy_tokens_match_transformers(case, hf, fd):
    images, before, after = CASES[case]
    ids, pixels = hf_inputs(images, before, after)
    kwargs = hf_image_kwargs(ids, pixels)
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=8, min_new_tokens=8, do_sample=False, **kwargs)
    want = out[0, len(ids) :].tolist()
    runner = VLRunner(fd)
    got = [int(runner.prefill(ids, pixels, [len(ids)])[-1].argmax())]
    while len(got) < 8:
        got.append(int(runner.decode(got[-1]).argmax()))
    assert got == want


def test_vision_tokens_go_to_the_vision_experts(fd):
    ids = np.array([5, START, IMG, IMG, END, 7])
    assert fd.vision_mask(ids).tolist() == [False, True, True, True, True, False]
    video = [ERNIE_VL_TOKENS[k] for k in ("video_start_token_id", "video_token_id", "video_end_token_id")]
    assert fd.vision_mask(np.array([5, *video])).tolist() == [False, True, True, True]
    meta, _ = make_attention_metadata([(0, 6, [0, 1])], 4)
    meta.prompt_rows = paddle.to_tensor(np.array([1, 1, 1, 1, 0, 0], dtype=np.uint8))
    assert fd.vision_mask(ids, meta).tolist() == [False, True, True, True, False, False]
    decode, _ = make_attention_metadata([(6, 1, [0, 1])], 4)  # a generated image-start token
    assert not fd.vision_mask(np.array([START]), decode).any()


def test_mrope_positions_follow_transformers(hf, fd):
    ids, pixels = hf_inputs(*CASES["two_images"])
    arr = np.asarray(ids)
    want, delta = hf.model.get_rope_index(
        torch.tensor([ids]),
        mm_token_type_ids=torch.tensor((arr == IMG).astype(np.int64)[None]),
        image_grid_thw=torch.tensor(pixels["image_grid_thw"]),
    )
    got, got_delta = fd.mm_positions(ids, features_of(ids, pixels))
    assert got.tolist() == want[:, 0].tolist()
    assert got_delta == int(delta[0, 0])


# Quantized vs fp32 fd, relative L2 error of the image+text prefill logits. Bounds as for ERNIE-4.5 MoE
# (tests/ernie/test_moe_layer.py): above an unquantized path's 0, far below a broken one's ~100%.
QUANT_BOUNDS = {"wint8": (1e-4, 0.05), "wint4": (1e-3, 0.2)}


@pytest.mark.parametrize("quant", ["wint8", "wint4"])
def test_weight_only_quantization_of_the_experts(checkpoint, fd, quant):
    """FastDeploy's meaning: wint8 every LLM linear; wint4 the routed experts (text and vision) 4-bit,
    attention, dense MLPs and shared experts 8-bit. The router and the vision side stay fp32."""
    model = Ernie4_5_VLMoeForConditionalGeneration(
        read_model_config(checkpoint), EngineConfig(model=str(checkpoint), quantization=quant)
    )
    model.load_weights(iter_hf_weights(checkpoint))
    moe = model.layers[1].mlp
    for expert in (moe.text_moe.experts[0], moe.vision_moe.experts[3]):
        assert expert.gate_up_proj.lw.quantization == quant
        assert expert.down_proj.lw.quantization == quant
    assert moe.shared_experts.gate_up_proj.lw.quantization == "wint8"
    assert model.layers[0].self_attn.qkv_proj.lw.quantization == "wint8"
    assert model.layers[0].mlp.down_proj.lw.quantization == "wint8"
    assert model.vision.blocks[0].qkv.lw.quantization is None
    ids, pixels = hf_inputs(*CASES["one_image"])
    want = VLRunner(fd).prefill(ids, pixels, [len(ids)])
    got = VLRunner(model).prefill(ids, pixels, [len(ids)])
    rel = np.linalg.norm(got - want) / np.linalg.norm(want)
    lo, hi = QUANT_BOUNDS[quant]
    assert lo < rel < hi, f"{quant}: relative logit error {rel:.4f} outside ({lo}, {hi})"


def test_vision_side_matches_transformers(hf, fd):
    """Tower + resampler rows per image, two images of different grids in one call."""
    ids, pixels = hf_inputs(*CASES["two_images"])
    got = fd.embed_images(features_of(ids, pixels))
    with torch.no_grad():
        want = hf.model.get_image_features(
            torch.tensor(pixels["pixel_values"]), torch.tensor(pixels["image_grid_thw"])
        ).pooler_output
    assert [g.shape[0] for g in got] == [w.shape[0] for w in want]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=0, atol=ATOL)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        # The language model's keys are text_config's (an override merges into that sub-config).
        ({"text_config": {"moe_intermediate_size": 32}}, "moe_intermediate_size must be"),
        ({"text_config": {"mlp_layer_types": ["dense", "sparse"]}}, "mlp_layer_types"),
        ({"text_config": {"rope_parameters": {"mrope_section": [2, 4, 2]}}}, "mrope_section"),
        ({"vision_config": {**VISION, "hidden_act": "relu"}}, "vision hidden_act"),
        ({"vision_config": {**VISION, "temporal_merge_size": 1}}, "temporal_merge_size"),
    ],
)
def test_unsupported_configs_are_clear_errors(checkpoint, change, message):
    cfg = read_model_config(checkpoint, hf_overrides=change)
    with pytest.raises(ModelLoadError, match=message):
        Ernie4_5_VLMoeForConditionalGeneration(cfg, EngineConfig(model=str(checkpoint)))


def test_missing_vision_tensor_is_a_load_error(checkpoint):
    model = Ernie4_5_VLMoeForConditionalGeneration(
        read_model_config(checkpoint), EngineConfig(model=str(checkpoint))
    )
    weights = [(n, w) for n, w in iter_hf_weights(checkpoint) if "resampler_model.mlp.bias" not in n]
    with pytest.raises(ModelLoadError, match="resampler_model.mlp.bias"):
        model.load_weights(iter(weights))
