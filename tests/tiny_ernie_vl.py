"""A tiny random ERNIE-4.5-VL checkpoint made with transformers, shared by the model, engine, server
and pooling tests: `make_tiny_ernie_vl(folder)` saves it (config.json + safetensors, as transformers'
save_pretrained writes them) with a tiny byte-level tokenizer, and returns the folder.

Import with tests/ on sys.path (tests/models/conftest.py, tests/multimodal/conftest.py).
The special image tokens get ids inside the tiny vocab (ERNIE_VL_TOKENS), and the tokenizer knows
them by their ERNIE spellings, so a chat template or a test can write them as text.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tiny_models

ERNIE_VL_ARCH = "Ernie4_5_VLMoeForConditionalGeneration"
# The image/video specials, added to the tiny tokenizer after its 300 ordinary ids, in this order.
ERNIE_VL_SPELLINGS = {
    "image_start_token_id": "<|IMAGE_START|>",
    "image_end_token_id": "<|IMAGE_END|>",
    "image_token_id": "<|IMAGE_PLACEHOLDER|>",
    "video_start_token_id": "<|VIDEO_START|>",
    "video_end_token_id": "<|VIDEO_END|>",
    "video_token_id": "<|VIDEO_PLACEHOLDER|>",
}
ERNIE_VL_TOKENS = {key: 300 + i for i, key in enumerate(ERNIE_VL_SPELLINGS)}
# ChatML with ERNIE's image run for each image part.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for part in m['content'] %}"
    "{% if part['type'] == 'image' %}<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
VISION = dict(
    depth=2,
    hidden_size=32,
    num_heads=2,
    intermediate_size=64,
    patch_size=14,
    spatial_merge_size=2,
    temporal_merge_size=2,
    rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "axial", "rope_theta": 10000.0},
)
# Layer 0 dense, layers 1-2 MoE with 4 text experts (intermediate 32) and 4 vision experts
# (intermediate 16), top-2, one shared expert. head_dim 16: mrope_section [3, 3, 2] covers its 8 pairs.
TEXT = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=512,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    moe_num_experts=4,
    moe_k=2,
    moe_intermediate_size=[32, 16],
    moe_num_shared_experts=1,
    mlp_layer_types=["dense", "sparse", "sparse"],
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [3, 3, 2]},
)


def make_tiny_ernie_vl(folder: str | Path, seed: int = 0, tokenizer: bool = True) -> Path:
    import torch  # noqa: PLC0415 - test-only dependencies
    from transformers import Ernie4_5_VLMoeConfig, Ernie4_5_VLMoeForConditionalGeneration  # noqa: PLC0415

    folder = Path(folder)
    torch.manual_seed(seed)
    config = Ernie4_5_VLMoeConfig(
        text_config=dict(TEXT), vision_config=dict(VISION), tie_word_embeddings=True, **ERNIE_VL_TOKENS
    )
    model = Ernie4_5_VLMoeForConditionalGeneration(config).eval()
    norms = ("norm.weight", "ln.weight", "norm1.weight", "norm2.weight", "after_norm.weight")
    tiny_models.randomize_weights(model, norms, small=("e_score_correction_bias",))
    model.save_pretrained(folder)
    if tokenizer:
        tiny_models.write_tiny_tokenizer(folder)
        _add_image_specials(folder)
    return folder


def _add_image_specials(folder: Path) -> None:
    """Give the tokenizer ERNIE's image/video special tokens (at ERNIE_VL_TOKENS' ids) and a chat
    template that writes an image part as ERNIE's does."""
    ids = tiny_models.add_special_tokens(folder, list(ERNIE_VL_SPELLINGS.values()), CHAT_TEMPLATE)
    for key, text in ERNIE_VL_SPELLINGS.items():
        assert ids[text] == ERNIE_VL_TOKENS[key], (text, ids[text])


def make_tiny_ernie_vl_reward(folder: str | Path, seed: int = 0) -> Path:
    """The tiny ERNIE-4.5-VL body (vision side included) under a reward head: architecture
    Ernie4_5_VLMoeForRewardModel, score.0 (hidden -> hidden) -> ReLU -> score.2 (hidden -> 1), the
    layout fd's pooling adapters read (no transformers class: the tests compute the head)."""
    folder = make_tiny_ernie_vl(folder, seed)
    return tiny_models.add_reward_head(folder, "Ernie4_5_VLMoeForRewardModel", TEXT["hidden_size"], seed)


def load_hf_ernie_vl(folder: str | Path):
    from transformers import Ernie4_5_VLMoeForConditionalGeneration  # noqa: PLC0415

    return Ernie4_5_VLMoeForConditionalGeneration.from_pretrained(folder, attn_implementation="eager").eval()


def hf_pixels(images: list, **processor_kwargs) -> dict:
    """transformers' ERNIE-4.5-VL image processor (PIL backend, built with `processor_kwargs`) over
    `images`, numpy arrays."""
    from transformers.models.ernie4_5_vl_moe.image_processing_pil_ernie4_5_vl_moe import (  # noqa: PLC0415
        Ernie4_5_VLMoeImageProcessorPil,
    )

    return Ernie4_5_VLMoeImageProcessorPil(**processor_kwargs)(images=images, return_tensors="np")


def expand_placeholders(ids: list[int], pixels: dict | None) -> list[int]:
    """`ids` with each <|IMAGE_PLACEHOLDER|> repeated once per LLM token of its image, as transformers'
    processor expands it (4 patches merge into one token)."""
    if pixels is None:
        return list(ids)
    img = ERNIE_VL_TOKENS["image_token_id"]
    counts = iter(int(np.prod(g)) // 4 for g in pixels["image_grid_thw"])
    return [t for i in ids for t in ([img] * next(counts) if i == img else [i])]


def hf_image_kwargs(ids: list[int], pixels: dict | None) -> dict:
    """The image inputs of transformers' ERNIE-4.5-VL forward/generate for the expanded prompt `ids`:
    pixels, grids, the placeholder mask and the vision-expert mask (placeholders and image brackets)."""
    import torch  # noqa: PLC0415

    if pixels is None:
        return {}
    arr = np.asarray(ids)
    image = [ERNIE_VL_TOKENS[k] for k in ("image_start_token_id", "image_end_token_id", "image_token_id")]
    return dict(
        pixel_values=torch.tensor(np.asarray(pixels["pixel_values"])),
        image_grid_thw=torch.tensor(np.asarray(pixels["image_grid_thw"])),
        mm_token_type_ids=torch.tensor((arr == ERNIE_VL_TOKENS["image_token_id"]).astype(np.int64)[None]),
        moe_mm_token_type_ids=torch.tensor(np.isin(arr, image).astype(np.int64)[None]),
    )
