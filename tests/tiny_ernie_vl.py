"""A tiny random ERNIE-4.5-VL checkpoint made with transformers, shared by the model, engine, server
and pooling tests: `make_tiny_ernie_vl(folder)` saves it (config.json + safetensors, as transformers'
save_pretrained writes them) with a tiny byte-level tokenizer, and returns the folder.

Import with tests/ on sys.path (tests/models/conftest.py, tests/multimodal/conftest.py).
The special image tokens get ids inside the tiny vocab (ERNIE_VL_TOKENS), and the tokenizer knows
them by their ERNIE spellings, so a chat template or a test can write them as text.
"""

from __future__ import annotations

import json
from pathlib import Path

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
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(
                ("norm.weight", "ln.weight", "norm1.weight", "norm2.weight", "after_norm.weight")
            ):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("e_score_correction_bias"):
                p.copy_(0.05 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
    model.save_pretrained(folder)
    if tokenizer:
        tiny_models.write_tiny_tokenizer(folder)
        _add_image_specials(folder)
    return folder


def _add_image_specials(folder: Path) -> None:
    """Give the tokenizer ERNIE's image/video special tokens (at ERNIE_VL_TOKENS' ids) and a chat
    template that writes an image part as ERNIE's does."""
    from tokenizers import AddedToken, Tokenizer  # noqa: PLC0415

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in ERNIE_VL_SPELLINGS.values()]
    )
    for key, text in ERNIE_VL_SPELLINGS.items():
        assert tok.token_to_id(text) == ERNIE_VL_TOKENS[key], (text, tok.token_to_id(text))
    tok.save(str(folder / "tokenizer.json"))
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["chat_template"] = CHAT_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))


def make_tiny_ernie_vl_reward(folder: str | Path, seed: int = 0) -> Path:
    """The tiny ERNIE-4.5-VL body (vision side included) under a reward head: architecture
    Ernie4_5_VLMoeForRewardModel, score.0 (hidden -> hidden) -> ReLU -> score.2 (hidden -> 1), the
    layout fd's pooling adapters read (no transformers class: the tests compute the head)."""
    import torch  # noqa: PLC0415
    from safetensors.torch import load_file, save_file  # noqa: PLC0415

    folder = make_tiny_ernie_vl(folder, seed)
    tensors = load_file(str(folder / "model.safetensors"))
    g = torch.Generator().manual_seed(seed + 1)
    h = TEXT["hidden_size"]
    tensors["score.0.weight"] = 0.15 * torch.randn(h, h, generator=g)
    tensors["score.0.bias"] = 0.15 * torch.randn(h, generator=g)
    tensors["score.2.weight"] = 0.15 * torch.randn(1, h, generator=g)
    tensors["score.2.bias"] = 0.15 * torch.randn(1, generator=g)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config.update(architectures=["Ernie4_5_VLMoeForRewardModel"], num_labels=1)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def load_hf_ernie_vl(folder: str | Path):
    from transformers import Ernie4_5_VLMoeForConditionalGeneration  # noqa: PLC0415

    return Ernie4_5_VLMoeForConditionalGeneration.from_pretrained(folder, attn_implementation="eager").eval()
