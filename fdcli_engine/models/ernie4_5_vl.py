"""Ernie4_5_VLMoeForConditionalGeneration (ERNIE-4.5-VL-28B-A3B, -424B-A47B): the ERNIE-4.5 decoder
with modality-isolated experts and 3-D rotary positions, fed by the vision side in
ernie4_5_vl_vision.py.

Experts: every MoE layer holds two routed mixtures of `moe_num_experts` experts each, one for text
tokens (intermediate moe_intermediate_size[0]) and one for vision tokens (moe_intermediate_size[1]),
each with its own router and correction bias, and shared experts every token goes through. A token
is a vision token when it is an image placeholder of the prompt or the image start/end token around
one, the video specials likewise (transformers' moe_mm_token_type_ids); generated tokens are text
tokens. Routing inside each
mixture is layers/moe.py's. `mlp_layer_types` says which layers are MoE ("sparse") and which dense.

Positions (transformers' get_rope_index): a text token at index i after the last image has the
same position on the t, h and w axes; an image of H x W LLM tokens starting at position s gets t = s,
h = s + row, w = s + column, and the text after it continues at s + max(H, W). Rotary frequency pair
i < hw = mrope_section[0] + mrope_section[1] turns by the h position when i is even and by the w
position when i is odd; the pairs from hw on turn by the t position. ERNIE's interleaved pairs are
permuted to NeoX halves at load (ernie4_5.py), so pair i is element i with element i + head_dim/2,
and fd's rotary op applies the step's per-row cos/sin table. A text-only row reduces to the ordinary
ERNIE rotary at its position.

Checkpoint names (transformers' save_pretrained writes Baidu's layout), besides the text decoder's:
    model.layers.{i}.mlp.gate.weight, .gate.weight_1      [hidden, E]: text, vision router (transposed)
    model.layers.{i}.mlp.moe_statics.e_score_correction_bias   [2, E]: text row, vision row
    model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight   e < E text, E <= e < 2E vision
    model.layers.{i}.mlp.shared_experts.{gate,up,down}_proj.weight
    model.vision_model.*, model.resampler_model.*   (ernie4_5_vl_vision.py)
"""

from __future__ import annotations

import numpy as np
import paddle

from fdcli_engine.errors import ModelLoadError
from fdcli_engine.layers import GatedMLP
from fdcli_engine.layers.moe import MoE
from fdcli_engine.layers.mrope import MRotaryEmbedding
from fdcli_engine.models.ernie4_5 import Ernie4_5ForCausalLM, ernie_defaults
from fdcli_engine.models.ernie4_5_moe import expert_quantizations, mlp_targets
from fdcli_engine.models.ernie4_5_vl_vision import Ernie4_5_VLVision
from fdcli_engine.models.qwen2_5_vl import encode_images, mrope_positions
from fdcli_engine.resolved_config import ResolvedConfig

# transformers' Ernie4_5_VLMoeConfig defaults. Every one of these tokens in the prompt goes to the
# vision experts, as transformers' processor marks them (video ones included, though fd takes no video).
DEFAULT_TOKEN_IDS = {
    "image_token_id": 100295,
    "image_start_token_id": 101304,
    "image_end_token_id": 101305,
    "video_token_id": 103367,
    "video_start_token_id": 101306,
    "video_end_token_id": 101307,
}


class ErnieMRotaryEmbedding(MRotaryEmbedding):
    """M-RoPE with ERNIE's assignment of frequency pairs to axes (module docstring) over NeoX-permuted
    heads; the step tables and the 1-D fast path are layers/mrope.py's."""

    def __init__(self, head_dim: int, max_position: int, base: float, mrope_section: list[int]):
        half = head_dim // 2
        if len(mrope_section) != 3 or sum(mrope_section) != half or mrope_section[0] != mrope_section[1]:
            raise ModelLoadError(
                f"mrope_section {mrope_section} must be [a, a, b] with 2a + b = head_dim / 2 = {half}"
            )
        super().__init__(head_dim, max_position, base, mrope_section)
        hw = 2 * mrope_section[0]
        pair = np.arange(half)
        axis = np.where(pair >= hw, 0, np.where(pair % 2 == 0, 1, 2))  # 0 t, 1 h, 2 w
        self._axis_of_column = np.concatenate([axis, axis])


class _Transposed:
    """Target for a router stored [hidden, E] (Baidu's layout); the router loads [E, hidden]."""

    def __init__(self, gate):
        self.gate = gate

    def load(self, array: np.ndarray) -> None:
        self.gate.load(np.asarray(array).T)


class _BiasRows:
    """Target for the [2, E] correction bias: row 0 the text router's, row 1 the vision router's."""

    def __init__(self, text, vision):
        self.text, self.vision = text, vision

    def load(self, array: np.ndarray) -> None:
        array = np.asarray(array, dtype=np.float32)
        if array.shape != (2, self.text.num_experts):
            raise ValueError(f"correction bias shape {array.shape} != expected (2, {self.text.num_experts})")
        self.text.load(array[0])
        self.vision.load(array[1])


class VisionTextMoE:
    """Text tokens through text_moe, vision tokens through vision_moe, every token through the shared
    experts."""

    def __init__(self, cfg: dict, expert_quant, dense_quant):
        hidden, num_experts, k = int(cfg["hidden_size"]), int(cfg["moe_num_experts"]), int(cfg["moe_k"])
        text_size, vision_size = (int(s) for s in cfg["moe_intermediate_size"])
        norm_min = float(cfg.get("moe_norm_min", 1e-12))
        self.text_moe = MoE(hidden, text_size, num_experts, k, norm_min=norm_min, quantization=expert_quant)
        self.vision_moe = MoE(
            hidden, vision_size, num_experts, k, norm_min=norm_min, quantization=expert_quant
        )
        shared = int(cfg.get("moe_num_shared_experts") or 0)
        self.shared_experts = GatedMLP(hidden, text_size * shared, dense_quant) if shared else None

    def __call__(self, x, prompt_rows=None, vision_mask: np.ndarray | None = None):
        if vision_mask is None or not vision_mask.any():
            out = self.text_moe(x, prompt_rows)
        elif vision_mask.all():
            out = self.vision_moe(x)
        else:
            text_idx, vision_idx = np.nonzero(~vision_mask)[0], np.nonzero(vision_mask)[0]
            text_out = self.text_moe(paddle.gather(x, paddle.to_tensor(text_idx)))
            vision_out = self.vision_moe(paddle.gather(x, paddle.to_tensor(vision_idx)))
            inverse = np.argsort(np.concatenate([text_idx, vision_idx]), kind="stable")
            out = paddle.gather(paddle.concat([text_out, vision_out]), paddle.to_tensor(inverse))
        if self.shared_experts is not None:
            out = out + self.shared_experts(x, prompt_rows)
        return out

    def targets(self, prefix: str) -> dict:
        t = {
            f"{prefix}.gate.weight": (_Transposed(self.text_moe.gate), None, "weight"),
            f"{prefix}.gate.weight_1": (_Transposed(self.vision_moe.gate), None, "weight"),
            f"{prefix}.moe_statics.e_score_correction_bias": (
                _BiasRows(self.text_moe.correction_bias, self.vision_moe.correction_bias),
                None,
                "weight",
            ),
        }
        num = self.text_moe.num_experts
        mlps = {f"experts.{e}": self.text_moe.experts[e] for e in range(num)}
        mlps |= {f"experts.{num + e}": self.vision_moe.experts[e] for e in range(num)}
        if self.shared_experts is not None:
            mlps["shared_experts"] = self.shared_experts
        return t | mlp_targets(prefix, mlps)


class Ernie4_5_VLMoeForConditionalGeneration(Ernie4_5ForCausalLM):
    keeps_aux_hidden_states = False  # its own layer loop (vision experts), not decode_layers

    def __init__(self, hf_config: dict, engine_config: ResolvedConfig):
        cfg = ernie_defaults(hf_config)
        if not isinstance(cfg.get("moe_intermediate_size"), list) or len(cfg["moe_intermediate_size"]) != 2:
            raise ModelLoadError("moe_intermediate_size must be [text, vision] sizes for ERNIE-4.5-VL")
        expert_quant, dense_quant = expert_quantizations(engine_config.quantization)
        super().__init__(cfg, engine_config.replace(quantization=dense_quant))
        if self.group.world_size > 1:
            raise ModelLoadError("ERNIE-4.5-VL does not support --tensor-parallel-size > 1 in fd yet")
        kinds = cfg.get("mlp_layer_types") or ["dense"] + ["sparse"] * (self.num_layers - 1)
        if len(kinds) != self.num_layers or set(kinds) - {"dense", "sparse"}:
            raise ModelLoadError(
                f"mlp_layer_types {kinds} must list dense/sparse for each of {self.num_layers} layers"
            )
        self.moe_layer_ids = [i for i, kind in enumerate(kinds) if kind == "sparse"]
        for i in self.moe_layer_ids:
            self.layers[i].mlp = VisionTextMoE(cfg, expert_quant, dense_quant)
        rope = cfg.get("rope_parameters") or {}
        section = [int(x) for x in rope.get("mrope_section", [22, 22, 20])]
        max_position = self.layers[0].self_attn.rotary.max_position
        self.mrotary = ErnieMRotaryEmbedding(
            self.head_dim, max_position, float(self.config["rope_theta"]), section
        )
        for layer in self.layers:
            layer.self_attn.rotary = self.mrotary
        self.vision = Ernie4_5_VLVision(cfg, self.hidden_size, float(cfg.get("rms_norm_eps", 1e-5)))
        self.spatial_merge_size = self.vision.merge
        ids = {k: int(cfg.get(k, v)) for k, v in DEFAULT_TOKEN_IDS.items()}
        self.image_token_id = ids["image_token_id"]
        self.vision_token_ids = tuple(ids.values())
        self._targets = self._build_targets(False)

    def _build_targets(self, qkv_bias: bool) -> dict:
        """The text decoder's names with each MoE layer's MLP replaced by its experts, plus the vision
        side's."""
        targets = super()._build_targets(qkv_bias)
        for i in getattr(self, "moe_layer_ids", []):  # none while the base __init__ runs
            targets |= self.layers[i].mlp.targets(f"model.layers.{i}.mlp")
        if hasattr(self, "vision"):
            targets |= self.vision.targets()
        return targets

    # The runner's multimodal hooks (qwen2_5_vl.py describes them).
    def embed_images(self, features) -> list[paddle.Tensor]:
        return encode_images(self.vision, features)

    def mm_positions(self, prompt_token_ids, features) -> tuple[np.ndarray, int]:
        return mrope_positions(prompt_token_ids, features, self.spatial_merge_size)

    def vision_mask(self, input_ids, meta=None) -> np.ndarray:
        """Rows the vision experts take: image (and video) placeholders and start/end tokens, of the
        prompt only (transformers routes generated tokens to the text experts). The generate runner
        marks the prompt rows in meta.prompt_rows (None: a step of decodes only, whose ids are then
        not read); a pooling model's rows are all prompt rows. `input_ids`: numpy or a paddle tensor."""
        decode_only = meta is not None and meta.prompt_rows is None
        if decode_only and not getattr(self, "is_pooling_model", False):
            return np.zeros(int(input_ids.shape[0]), dtype=bool)
        if isinstance(input_ids, paddle.Tensor):
            input_ids = input_ids.numpy()
        mask = np.isin(np.asarray(input_ids), self.vision_token_ids)
        if meta is None or meta.prompt_rows is None or not mask.any():
            return mask  # no metadata, a pooling model's decode-free step, or no vision token
        return mask & (meta.prompt_rows.numpy() != 0)

    def forward(self, input_ids, positions, kv_caches, meta, mm_embeds=None) -> paddle.Tensor:
        """`positions` int64 [T] (text rows: one position on every axis) or [3, T]; `mm_embeds` (rows
        int64 [K], values [K, hidden]) replaces those rows' token embeddings."""
        with paddle.no_grad():
            hidden = self.embed_tokens(input_ids)
            if mm_embeds is not None:
                index, values = mm_embeds
                hidden = paddle.scatter(hidden, index, values, overwrite=True)
            vision_mask = self.vision_mask(input_ids, meta)
            residual = None
            for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches, strict=True)):
                if residual is None:
                    residual, x = hidden, layer.input_layernorm(hidden)
                else:
                    x, residual = layer.input_layernorm(hidden, residual)
                hidden = layer.self_attn(positions, x, kv_cache, meta)
                x, residual = layer.post_attention_layernorm(hidden, residual)
                if i in self.moe_layer_ids:
                    hidden = layer.mlp(x, meta.prompt_rows, vision_mask)
                else:
                    hidden = layer.mlp(x, meta.prompt_rows)
            out, _ = self.norm(hidden, residual)
            return out
