"""ERNIE-4.5-VL's vision side: the ViT over 14x14 patches and the variable-resolution resampler that
turns each 2x2 merge window of patch features into one LLM token embedding.

Vision tower (transformers' `Ernie4_5_VLMoeVisionTransformerPretrainedModel`): a bias-free linear
patch embedding, `depth` pre-LayerNorm blocks (full bidirectional attention inside one image, 2-D
rotary, an fc1 -> quick_gelu -> fc2 MLP), a final LayerNorm. The 2-D rotary gives the first quarter
of each head's frequencies the patch row and the second quarter the patch column (NeoX halves), with
base frequencies theta^(-4i/head_dim); fd's rotary op applies it from a per-image cos/sin table.

Resampler: the rows arrive in merge-window order (multimodal/patches.py), so each window is 4
consecutive rows, concatenated into one vector. spatial_linear (fc1, GELU, fc2, LayerNorm), then the
temporal step, which for a still image concatenates the vector with itself (a video would pair
frames), temporal_linear (same shape of MLP), a linear into the text width, and an RMSNorm.

Checkpoint names (what transformers' save_pretrained writes, Baidu's layout):
    model.vision_model.patch_embed.proj.weight
    model.vision_model.blocks.{i}.{norm1,norm2}.{weight,bias}
    model.vision_model.blocks.{i}.attn.{qkv,proj}.{weight,bias}
    model.vision_model.blocks.{i}.mlp.{fc1,fc2}.{weight,bias}
    model.vision_model.ln.{weight,bias}
    model.resampler_model.{spatial,temporal}_linear.{0,2}.{weight,bias}   (fc1, fc2)
    model.resampler_model.{spatial,temporal}_linear.3.{weight,bias}       (LayerNorm)
    model.resampler_model.mlp.{weight,bias}, model.resampler_model.after_norm.weight
"""

from __future__ import annotations

import numpy as np
import paddle
import paddle.nn.functional as F

from fdcli_engine import ops
from fdcli_engine.errors import ModelLoadError
from fdcli_engine.layers import RMSNorm
from fdcli_engine.layers.linear import Linear
from fdcli_engine.models.qwen2_5_vl_vision import vision_positions

VISION_PREFIX = "model.vision_model."
RESAMPLER_PREFIX = "model.resampler_model."


class LayerNorm:
    """LayerNorm with weight and bias, loaded one tensor at a time."""

    def __init__(self, size: int, eps: float):
        self.size = size
        self.eps = float(eps)
        self.params: dict[str, paddle.Tensor] = {}

    def slot(self, name: str) -> ParamSlot:
        return ParamSlot(self, name, (self.size,))

    def __call__(self, x):
        return F.layer_norm(x, [self.size], self.params["weight"], self.params["bias"], self.eps)


class ParamSlot:
    """A checkpoint target that stores one array, shape-checked, as owner.params[name]."""

    def __init__(self, owner, name: str, shape: tuple[int, ...]):
        self.owner, self.name, self.shape = owner, name, shape

    def load(self, array: np.ndarray) -> None:
        if tuple(array.shape) != self.shape:
            raise ValueError(f"shape {tuple(array.shape)} != expected {self.shape}")
        self.owner.params[self.name] = paddle.to_tensor(np.asarray(array, dtype=np.float32))


def quick_gelu(x):
    return x * F.sigmoid(1.702 * x)


ACTIVATIONS = {"quick_gelu": quick_gelu, "gelu": lambda x: F.gelu(x, approximate=False)}


class VisionBlock:
    def __init__(self, dim: int, num_heads: int, mlp_dim: int, eps: float, act):
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.norm1, self.norm2 = LayerNorm(dim, eps), LayerNorm(dim, eps)
        self.qkv = Linear(dim, 3 * dim, bias=True)
        self.proj = Linear(dim, dim, bias=True)
        self.fc1 = Linear(dim, mlp_dim, bias=True)
        self.fc2 = Linear(mlp_dim, dim, bias=True)
        self.act = act

    def targets(self, prefix: str) -> dict:
        t = {
            f"{prefix}{n}.{k}": (getattr(self, n).slot(k), None, k)
            for n in ("norm1", "norm2")
            for k in ("weight", "bias")
        }
        for name, module in (
            ("attn.qkv", self.qkv),
            ("attn.proj", self.proj),
            ("mlp.fc1", self.fc1),
            ("mlp.fc2", self.fc2),
        ):
            t |= {f"{prefix}{name}.{k}": (module, 0, k) for k in ("weight", "bias")}
        return t

    def __call__(self, x, rows, table, cu_seqlens):
        x = x + self._attention(self.norm1(x), rows, table, cu_seqlens)
        return x + self.fc2(self.act(self.fc1(self.norm2(x))))

    def _attention(self, x, rows, table, cu_seqlens):
        """Bidirectional within each image (cu_seqlens: the images' patch boundaries), never across."""
        n, dim = x.shape
        q, k, v = paddle.split(self.qkv(x), 3, axis=-1)
        q, k = ops.rotary_embedding(rows, q.contiguous(), k.contiguous(), table, self.head_dim)
        shape = [n, self.num_heads, self.head_dim]
        out = ops.varlen_attention(
            q.reshape(shape), k.reshape(shape), v.reshape(shape), cu_seqlens, self.head_dim**-0.5
        )
        return self.proj(out.reshape([n, dim]))


class MergerMLP:
    """fc1 -> GELU -> fc2 -> LayerNorm (the resampler's spatial and temporal steps)."""

    def __init__(self, in_dim: int, out_dim: int, eps: float):
        self.fc1, self.fc2 = Linear(in_dim, out_dim, bias=True), Linear(out_dim, out_dim, bias=True)
        self.ln = LayerNorm(out_dim, eps)

    def targets(self, prefix: str) -> dict:
        t = {
            f"{prefix}{i}.{k}": (m, 0, k)
            for i, m in (("0", self.fc1), ("2", self.fc2))
            for k in ("weight", "bias")
        }
        return t | {f"{prefix}3.{k}": (self.ln.slot(k), None, k) for k in ("weight", "bias")}

    def __call__(self, x):
        return self.ln(self.fc2(F.gelu(self.fc1(x), approximate=False)))


def vision_rotary_table(grid_thw: list[list[int]], head_dim: int, theta: float, merge: int) -> np.ndarray:
    """cos/sin rows [num_patches, head_dim] for the patches in merge-window order: angles p_h * f_i
    then p_w * f_i, f_i = theta^(-4i/head_dim), i < head_dim/4."""
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim // 2, 2, dtype=np.float64) / (head_dim // 2))
    pos = np.concatenate([vision_positions(g, merge) for g in grid_thw])
    angles = np.concatenate([pos[:, :1] * inv_freq, pos[:, 1:] * inv_freq], axis=1)
    return np.concatenate([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)


class Ernie4_5_VLVision:
    """pixel rows [P, 3*14*14] + grid_thw per image -> LLM token embeddings [P / merge**2, text hidden]."""

    def __init__(self, hf_config: dict, text_hidden: int, text_eps: float):
        v = hf_config.get("vision_config") or {}
        self.dim = int(v.get("hidden_size", 1280))
        self.num_heads = int(v.get("num_heads", 16))
        self.merge = int(v.get("spatial_merge_size", 2))
        if int(v.get("temporal_merge_size", 2)) != 2:
            raise ModelLoadError("ERNIE-4.5-VL's resampler needs vision_config.temporal_merge_size 2")
        act = v.get("hidden_act", "quick_gelu")
        if act not in ACTIVATIONS:
            raise ModelLoadError(f"vision hidden_act {act!r} is not supported: expected quick_gelu or gelu")
        rope = v.get("rope_parameters") or {}
        self.rope_theta = float(rope.get("rope_theta", 10000.0))
        eps = float(v.get("rms_norm_eps", 1e-6))
        patch_dim = int(v.get("in_channels", 3)) * int(v.get("patch_size", 14)) ** 2
        self.patch_embed = Linear(patch_dim, self.dim)
        mlp_dim = int(v.get("intermediate_size", 4 * self.dim))
        self.blocks = [
            VisionBlock(self.dim, self.num_heads, mlp_dim, eps, ACTIVATIONS[act])
            for _ in range(int(v.get("depth", 32)))
        ]
        self.ln = LayerNorm(self.dim, eps)
        spatial = self.dim * self.merge**2
        self.spatial_linear = MergerMLP(spatial, spatial, eps)
        self.temporal_linear = MergerMLP(2 * spatial, spatial, eps)
        self.out_proj = Linear(spatial, text_hidden, bias=True)
        self.after_norm = RMSNorm(text_hidden, text_eps)

    def targets(self) -> dict:
        t = {f"{VISION_PREFIX}patch_embed.proj.weight": (self.patch_embed, 0, "weight")}
        for i, block in enumerate(self.blocks):
            t |= block.targets(f"{VISION_PREFIX}blocks.{i}.")
        t |= {f"{VISION_PREFIX}ln.{k}": (self.ln.slot(k), None, k) for k in ("weight", "bias")}
        t |= self.spatial_linear.targets(f"{RESAMPLER_PREFIX}spatial_linear.")
        t |= self.temporal_linear.targets(f"{RESAMPLER_PREFIX}temporal_linear.")
        t |= {f"{RESAMPLER_PREFIX}mlp.{k}": (self.out_proj, 0, k) for k in ("weight", "bias")}
        return t | {f"{RESAMPLER_PREFIX}after_norm.weight": (self.after_norm, None, "weight")}

    def __call__(self, pixels: np.ndarray, grid_thw: list[list[int]]) -> paddle.Tensor:
        for t, _, _ in grid_thw:
            if t != 1:
                raise ValueError("ERNIE-4.5-VL in fd takes still images only (grid t = 1)")
        with paddle.no_grad():
            x = self.patch_embed(paddle.to_tensor(np.ascontiguousarray(pixels, dtype=np.float32)))
            table = paddle.to_tensor(
                vision_rotary_table(grid_thw, self.dim // self.num_heads, self.rope_theta, self.merge)
            )
            rows = paddle.arange(x.shape[0], dtype="int64")
            sizes = [t * h * w for t, h, w in grid_thw]
            cu_seqlens = paddle.to_tensor(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32))
            for block in self.blocks:
                x = block(x, rows, table, cu_seqlens)
            x = self.ln(x).reshape([-1, self.dim * self.merge**2])
            x = self.spatial_linear(x)
            x = self.temporal_linear(paddle.concat([x, x], axis=-1))  # a still image pairs with itself
            return self.after_norm(self.out_proj(x))
