"""Qwen2.5-VL's vision tower: patch embedding, blocks of (RMSNorm, attention with 2-D rotary, RMSNorm,
SwiGLU MLP) attending within windows except the `fullatt_block_indexes` blocks, and the patch merger
(merge^2 neighbouring patches -> one language-model token).

Patch rows arrive as the image processor made them ([num_patches, C*T*P*P], merge blocks contiguous).
The 3-D patch convolution has stride = kernel, so it is a matmul with the kernel flattened in the
same (C, T, P, P) order. Window attention needs each window's patches contiguous: rows are permuted
(by whole merge blocks) into window order before the blocks and back after the merger.
"""

from __future__ import annotations

import numpy as np
import paddle

from fdcli_engine import ops
from fdcli_engine.layers import Linear, MergedLinear, RMSNorm

VISION_EPS = 1e-6


def vision_positions(grid_thw: list[int], merge: int) -> np.ndarray:
    """int64 [t*h*w, 2]: each patch's (row, column) in its image, in merge-block order."""
    t, h, w = grid_thw
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    shape = (h // merge, merge, w // merge, merge)
    rows = rows.reshape(shape).transpose(0, 2, 1, 3).reshape(-1)
    cols = cols.reshape(shape).transpose(0, 2, 1, 3).reshape(-1)
    return np.tile(np.stack([rows, cols], axis=-1), (t, 1))


def window_order(grid_thw: list[int], merge: int, window: int) -> tuple[np.ndarray, list[int]]:
    """(merged-token order that puts each window's tokens together, window lengths in merged tokens).
    `window`: the window's side in merged tokens; windows tile the token grid from its top-left, the
    last row/column of windows cut short."""
    t, h, w = grid_thw
    lh, lw = h // merge, w // merge
    index = np.arange(t * lh * lw).reshape(t, lh, lw)
    order, lengths = [], []
    for ti in range(t):
        for r in range(0, lh, window):
            for c in range(0, lw, window):
                block = index[ti, r : r + window, c : c + window].reshape(-1)
                order.append(block)
                lengths.append(block.size)
    return np.concatenate(order), lengths


class VisionBlock:
    def __init__(self, dim: int, num_heads: int, intermediate: int):
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.norm1 = RMSNorm(dim, VISION_EPS)
        self.norm2 = RMSNorm(dim, VISION_EPS)
        self.qkv = Linear(dim, 3 * dim, bias=True)
        self.proj = Linear(dim, dim, bias=True)
        self.gate_up = MergedLinear(dim, [intermediate, intermediate], bias=True)
        self.down = Linear(intermediate, dim, bias=True)

    def __call__(self, x, cu_seqlens, rope_rows, rope_table):
        n, dim = x.shape
        qkv = self.qkv(self.norm1(x))
        q, k, v = paddle.split(qkv, 3, axis=-1)
        q, k = ops.rotary_embedding(rope_rows, q, k, rope_table, self.head_dim)
        shape = [n, self.num_heads, self.head_dim]
        attn = ops.varlen_attention(
            q.reshape(shape), k.reshape(shape), v.reshape(shape), cu_seqlens, self.head_dim**-0.5
        )
        x = x + self.proj(attn.reshape([n, dim]))
        return x + self.down(ops.silu_and_mul(self.gate_up(self.norm2(x))))


class Qwen2_5_VisionTransformer:
    def __init__(self, vc: dict):
        self.dim = int(vc["hidden_size"])
        self.num_heads = int(vc["num_heads"])
        self.head_dim = self.dim // self.num_heads
        # Older Qwen2.5-VL configs spell some keys as the original release did (spatial_patch_size, in_chans).
        self.patch_size = int(vc.get("patch_size") or vc.get("spatial_patch_size") or 14)
        self.temporal_patch_size = int(vc.get("temporal_patch_size", 2))
        self.in_channels = int(vc.get("in_channels") or vc.get("in_chans") or 3)
        self.merge = int(vc.get("spatial_merge_size", 2))
        self.window = int(vc.get("window_size", 112)) // self.merge // self.patch_size
        self.fullatt = {int(i) for i in vc.get("fullatt_block_indexes") or []}
        act = vc.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"vision_config.hidden_act {act!r} is not supported: expected silu")
        patch_dim = self.in_channels * self.temporal_patch_size * self.patch_size**2
        self.patch_embed = Linear(patch_dim, self.dim)
        self.blocks = [
            VisionBlock(self.dim, self.num_heads, int(vc["intermediate_size"]))
            for _ in range(int(vc["depth"]))
        ]
        merged = self.dim * self.merge**2
        self.merger_norm = RMSNorm(self.dim, VISION_EPS)
        self.merger_fc1 = Linear(merged, merged, bias=True)
        self.merger_fc2 = Linear(merged, int(vc["out_hidden_size"]), bias=True)
        # 2-D rotary: head_dim/4 frequencies, turned by the row for the first run and the column for the second.
        quarter = self.head_dim // 2
        theta = float((vc.get("rope_parameters") or {}).get("rope_theta", 10000.0))
        self.inv_freq = 1.0 / (theta ** (np.arange(0, quarter, 2, dtype=np.float32) / quarter))

    def targets(self, prefix: str = "visual.") -> dict[str, tuple[object, int | None, str]]:
        """Checkpoint name -> (module, shard, "weight" | "bias"), as DecoderForCausalLM's table."""
        out: dict[str, tuple[object, int | None, str]] = {
            f"{prefix}patch_embed.proj.weight": (self.patch_embed, 0, "weight"),
            f"{prefix}merger.ln_q.weight": (self.merger_norm, None, "weight"),
        }
        for i, lin in ((0, self.merger_fc1), (2, self.merger_fc2)):
            out[f"{prefix}merger.mlp.{i}.weight"] = (lin, 0, "weight")
            out[f"{prefix}merger.mlp.{i}.bias"] = (lin, 0, "bias")
        for b, blk in enumerate(self.blocks):
            p = f"{prefix}blocks.{b}."
            out[p + "norm1.weight"] = (blk.norm1, None, "weight")
            out[p + "norm2.weight"] = (blk.norm2, None, "weight")
            for name, lin, shard in (
                ("attn.qkv", blk.qkv, 0),
                ("attn.proj", blk.proj, 0),
                ("mlp.gate_proj", blk.gate_up, 0),
                ("mlp.up_proj", blk.gate_up, 1),
                ("mlp.down_proj", blk.down, 0),
            ):
                out[f"{p}{name}.weight"] = (lin, shard, "weight")
                out[f"{p}{name}.bias"] = (lin, shard, "bias")
        return out

    def _rope_table(self, pos: np.ndarray) -> np.ndarray:
        """[N, head_dim] cos/sin rows (rotate-half layout) of patch positions [N, 2]."""
        angles = np.concatenate([pos[:, :1] * self.inv_freq, pos[:, 1:] * self.inv_freq], axis=-1).astype(
            np.float32
        )
        return np.concatenate([np.cos(angles), np.sin(angles)], axis=-1)

    def _layout(self, grids: list[list[int]]):
        """Window order of the patch rows, the rope table in that order, and the window / image
        boundaries (cumulative patch counts) of the concatenated images."""
        unit = self.merge**2
        order, win, img, base = [], [0], [0], 0
        pos = []
        for grid in grids:
            tokens, lengths = window_order(grid, self.merge, self.window)
            order.append((tokens[:, None] * unit + np.arange(unit)).reshape(-1) + base)
            for n in lengths:
                win.append(win[-1] + n * unit)
            n_patches = int(np.prod(grid))
            img.append(img[-1] + n_patches)
            pos.append(vision_positions(grid, self.merge))
            base += n_patches
        order = np.concatenate(order)
        table = self._rope_table(np.concatenate(pos)[order])
        return order, table, np.asarray(win, dtype=np.int32), np.asarray(img, dtype=np.int32)

    def __call__(self, pixel_rows: np.ndarray, grids: list[list[int]]) -> paddle.Tensor:
        """[sum(t*h*w) / merge^2, out_hidden] language-model rows of the concatenated images' patches."""
        order, table, cu_win, cu_img = self._layout(grids)
        x = self.patch_embed(paddle.to_tensor(np.ascontiguousarray(pixel_rows[order])))
        rows = paddle.arange(x.shape[0], dtype="int64")
        rope = paddle.to_tensor(table)
        win, img = paddle.to_tensor(cu_win), paddle.to_tensor(cu_img)
        for i, blk in enumerate(self.blocks):
            x = blk(x, img if i in self.fullatt else win, rows, rope)
        # Window order keeps merge blocks whole, so merging before restoring the order is the same.
        x = self.merger_norm(x).reshape([-1, self.dim * self.merge**2])
        x = self.merger_fc2(ops.gelu(self.merger_fc1(x)))
        restore = np.argsort(order.reshape(-1, self.merge**2)[:, 0] // self.merge**2)
        return paddle.gather(x, paddle.to_tensor(restore))
