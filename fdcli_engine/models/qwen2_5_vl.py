"""Qwen2_5_VLForConditionalGeneration: the Qwen2 decoder with M-RoPE (layers/mrope.py) and a vision
tower (models/qwen2_5_vl_vision.py) whose rows replace the image placeholder tokens' embeddings.

The runner's multimodal hooks (any image model offers the same three):
- `embed_images(features) -> [paddle.Tensor [feature.length, hidden]]`: the encoder's rows per image;
- `mm_positions(prompt_token_ids, features) -> (int64 [3, L], delta)`: every prompt token's three
  positions, as transformers' get_rope_index lays them out (text continues after an image's largest
  position), and delta = max position + 1 - L: a generated token at index i sits at i + delta;
- `forward(..., mm_embeds=(rows int64 [K], values [K, hidden]))`: embeddings of those rows replaced.
"""

from __future__ import annotations

import numpy as np
import paddle

from fdcli_engine.errors import ModelLoadError
from fdcli_engine.layers.mrope import MRotaryEmbedding, mrope_section_of
from fdcli_engine.models.decoder import decode_layers
from fdcli_engine.models.qwen2 import Qwen2ForCausalLM
from fdcli_engine.models.qwen2_5_vl_vision import Qwen2_5_VisionTransformer

# Checkpoint spellings of transformers 5 (model.language_model., model.visual.) -> the older ones.
_RENAMES = (("model.language_model.", "model."), ("model.visual.", "visual."))


def _without_mrope_type(hf_config: dict) -> dict:
    """The config with an old-style rope_scaling {"type": "mrope"} dropped: its frequencies are plain
    rotary ones (the section is read separately)."""
    cfg = dict(hf_config)
    scaling = cfg.get("rope_scaling")
    if isinstance(scaling, dict) and (scaling.get("rope_type") or scaling.get("type")) in (
        "mrope",
        "default",
    ):
        cfg["rope_scaling"] = None
    return cfg


def mrope_positions(prompt_token_ids, features, merge: int) -> tuple[np.ndarray, int]:
    """(int64 [3, L], delta) for a prompt whose images own the ranges of `features` (by offset)."""
    n = len(prompt_token_ids)
    out = np.empty((3, n), dtype=np.int64)
    cur = done = 0
    for f in sorted(features, key=lambda f: f.offset):
        out[:, done : f.offset] = np.arange(cur, cur + f.offset - done)
        cur += f.offset - done
        t, h, w = f.grid_thw
        lh, lw = h // merge, w // merge
        if t * lh * lw != f.length:
            raise ValueError(f"image at {f.offset}: {f.length} placeholders for a {t}x{lh}x{lw} grid")
        ti, hi, wi = np.meshgrid(np.arange(t), np.arange(lh), np.arange(lw), indexing="ij")
        out[:, f.offset : f.end] = np.stack([ti.reshape(-1), hi.reshape(-1), wi.reshape(-1)]) + cur
        cur += max(lh, lw)
        done = f.end
    out[:, done:] = np.arange(cur, cur + n - done)
    return out, int(out.max()) + 1 - n if n else 0


def encode_images(encoder, features) -> list[paddle.Tensor]:
    """The LLM embeddings of each image's placeholders, [feature.length, hidden] per feature: one
    `encoder(pixel rows, grids)` call over every feature's pixels, its rows split by feature."""
    with paddle.no_grad():
        rows = encoder(np.concatenate([f.pixels() for f in features]), [f.grid_thw for f in features])
    sizes = [f.length for f in features]
    if sum(sizes) != rows.shape[0]:
        raise ValueError(f"the vision encoder made {rows.shape[0]} rows for {sum(sizes)} placeholders")
    return list(paddle.split(rows, sizes)) if len(sizes) > 1 else [rows]


class Qwen2_5_VLForConditionalGeneration(Qwen2ForCausalLM):
    def __init__(self, hf_config: dict, engine_config):
        section = mrope_section_of(hf_config)
        if section is None:
            raise ModelLoadError("config has no mrope_section (rope_parameters) for Qwen2.5-VL")
        super().__init__(_without_mrope_type(hf_config), engine_config)
        if self.group.world_size > 1:
            raise ModelLoadError(
                "Qwen2.5-VL does not run under tensor parallelism yet: use --tensor-parallel-size 1"
            )
        rotary = self.layers[0].self_attn.rotary
        mrope = MRotaryEmbedding(self.head_dim, rotary.max_position, self.config["rope_theta"], section)
        for layer in self.layers:
            layer.self_attn.rotary = mrope
        vc = hf_config.get("vision_config")
        if not isinstance(vc, dict):
            raise ModelLoadError("config has no vision_config for Qwen2.5-VL")
        self.visual = Qwen2_5_VisionTransformer(vc)
        self.merge_size = self.visual.merge
        self.image_token_id = int(hf_config["image_token_id"])
        self._targets.update(self.visual.targets())

    def load_weights(self, weights) -> None:
        def renamed():
            for name, array in weights:
                for old, new in _RENAMES:
                    if name.startswith(old):
                        name = new + name[len(old) :]
                        break
                if name == "visual.patch_embed.proj.weight":
                    array = np.asarray(array).reshape(
                        array.shape[0], -1
                    )  # the stride=kernel conv as a matmul
                yield name, array

        super().load_weights(renamed())

    def embed_images(self, features) -> list[paddle.Tensor]:
        return encode_images(self.visual, features)

    def mm_positions(self, prompt_token_ids, features) -> tuple[np.ndarray, int]:
        return mrope_positions(prompt_token_ids, features, self.merge_size)

    def forward(self, input_ids, positions, kv_caches, meta, mm_embeds=None) -> paddle.Tensor:
        with paddle.no_grad():
            hidden = self.embed_tokens(input_ids)
            if mm_embeds is not None:
                index, values = mm_embeds
                hidden = paddle.scatter(hidden, index, values, overwrite=True)
            return decode_layers(self, hidden, positions, kv_caches, meta)
