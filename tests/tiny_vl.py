"""A tiny random Qwen2.5-VL checkpoint for tests: transformers' Qwen2_5_VLForConditionalGeneration with
a small vision tower (window + full-attention blocks) and text model, every parameter randomized, saved
with its preprocessor_config.json and a byte-level tokenizer that has Qwen's vision tokens and a chat
template writing `<|vision_start|><|image_pad|><|vision_end|>` for each image part.

Import with tests/ on sys.path (tests/models/conftest.py, tests/multimodal/conftest.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from tiny_models import (
    add_reward_head,
    add_special_tokens,
    random_image,  # noqa: F401 - the VL tests' pictures, as tiny_vl.random_image
    randomize_weights,
    write_tiny_tokenizer,
)

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
VL_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for part in m['content'] %}"
    "{% if part['type'] == 'image' or part['type'] == 'image_url' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Small pixel budget: a 56x84 picture stays as is (4x6 patches -> 6 tokens), larger ones shrink.
MIN_PIXELS = 28 * 28
MAX_PIXELS = 28 * 28 * 16


def write_vl_tokenizer(folder: Path) -> dict[str, int]:
    """The tiny tokenizer plus the vision tokens; returns their ids."""
    write_tiny_tokenizer(folder)
    return add_special_tokens(folder, VISION_TOKENS, VL_CHAT_TEMPLATE)


def make_tiny_qwen2_5_vl(
    folder: str | Path,
    seed: int = 0,
    *,
    tie: bool = False,
    max_pixels: int = MAX_PIXELS,
    dims: dict | None = None,
) -> Path:
    """The checkpoint in `folder`; `max_pixels`: the processor's budget (Qwen's own is 28*28*1280);
    `dims`: text-config overrides (a larger model for benchmarks)."""
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    ids = write_vl_tokenizer(folder)
    torch.manual_seed(seed)
    vision = dict(
        depth=3,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        out_hidden_size=64,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
        window_size=56,  # 2x2 merged tokens a window: a 4x6-token image has several windows
        fullatt_block_indexes=[1],
    )
    text = dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
        tie_word_embeddings=tie,
    )
    text.update(dims or {})
    config = transformers.Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=tie,
    )
    model = transformers.Qwen2_5_VLForConditionalGeneration(config).eval()
    randomize_weights(model, ("norm.weight", "norm1.weight", "norm2.weight", "ln_q.weight"))
    model.save_pretrained(folder)
    pre = transformers.Qwen2VLImageProcessorPil(min_pixels=MIN_PIXELS, max_pixels=max_pixels)
    pre.save_pretrained(folder)
    return folder


def hf_processor(folder: Path):
    """transformers' Qwen2_5_VLProcessor over the tiny tokenizer, with the PIL image backend (the one
    fd's processor follows: Pillow's bicubic resize)."""
    import transformers  # noqa: PLC0415

    tok = transformers.AutoTokenizer.from_pretrained(folder)
    image_processor = transformers.Qwen2VLImageProcessorPil.from_pretrained(folder)
    return transformers.Qwen2_5_VLProcessor(
        image_processor=image_processor, tokenizer=tok, chat_template=VL_CHAT_TEMPLATE
    )


def make_tiny_qwen2_5_vl_reward(folder: str | Path, seed: int = 0) -> Path:
    """The tiny Qwen2.5-VL body (vision tower included) under a reward head: architecture
    Qwen2_5_VLForRewardModel, score.0 (hidden -> hidden) -> ReLU -> score.2 (hidden -> 1), the
    Qwen2.5-Math RM layout fd's adapters read (no transformers class: the tests compute the head)."""
    folder = make_tiny_qwen2_5_vl(folder, seed)
    h = json.loads((folder / "config.json").read_text())["text_config"]["hidden_size"]
    return add_reward_head(folder, "Qwen2_5_VLForRewardModel", h, seed)
