"""KV cache storage, one entry per decoder layer, handed to the attention layers as is:
- float32: (k_cache, v_cache), each [num_blocks, num_kv_heads, block_size, head_dim];
- bfloat16: (k_cache, v_cache) of that shape in Paddle bfloat16. reshape_and_cache rounds each value to
  nearest even (fd_kernels.reference.round_bf16) and paged_attention widens it back exactly, so
  attention is the fp32 computation on K/V rounded to 8 significant bits (relative error <= 2^-8 per
  element);
- int8, the C8 cache: (k_cache, v_cache, k_scales, v_scales), int8 codes of that shape plus one fp32
  scale per cached (block, head, slot): [num_blocks, num_kv_heads, block_size]. reshape_and_cache
  quantizes each new row (absmax / 127, see fd_kernels.reference.quantize_kv_s8) and paged_attention
  reads it back as code * scale. No calibration; per-token scales keep an outlier token from costing its
  neighbours precision, and make a token's codes independent of what was batched or cached with it.

Bytes per token and KV head, K and V each: 4 * head_dim in fp32, 2 * head_dim in bf16 (2x less), head_dim
+ 4 in int8 (3.76x less at head_dim 64, SmolLM2; 3.88x at 128), so a --kv-cache-memory-gb budget holds
that many more blocks.
"""

from __future__ import annotations

import paddle

from fdcli_engine import ops


def bytes_per_token_head(head_dim: int, kv_cache_dtype: str) -> int:
    """Bytes one token costs per KV head, for K or for V."""
    return {"int8": head_dim + 4, "bfloat16": 2 * head_dim}.get(kv_cache_dtype, 4 * head_dim)


def kv_block_bytes(model, block_size: int, kv_cache_dtype: str = "float32") -> int:
    per_layer = model.num_kv_heads * block_size * bytes_per_token_head(model.head_dim, kv_cache_dtype)
    return 2 * model.num_layers * per_layer


def _zeros(shape: list[int], dtype: str) -> paddle.Tensor:
    """A zeroed cache tensor on 2 MB pages where the kernel gives them (ops.huge_pages): advised before
    the zero fill first touches it, so the fill faults huge pages in and every step's reads of the cache
    walk 512x fewer pages."""
    t = paddle.empty(shape, dtype=dtype)
    ops.huge_pages([t], touched=False)
    return t.zero_()


def allocate_kv_caches(
    model, num_blocks: int, block_size: int, kv_cache_dtype: str = "float32"
) -> list[tuple]:
    shape = [num_blocks, model.num_kv_heads, block_size, model.head_dim]
    if kv_cache_dtype == "int8":
        # Scales start at 0, so a slot never written dequantizes to 0 (it is never read anyway).
        return [
            (
                _zeros(shape, "int8"),
                _zeros(shape, "int8"),
                _zeros(shape[:3], "float32"),
                _zeros(shape[:3], "float32"),
            )
            for _ in range(model.num_layers)
        ]
    dtype = "bfloat16" if kv_cache_dtype == "bfloat16" else "float32"
    return [(_zeros(shape, dtype), _zeros(shape, dtype)) for _ in range(model.num_layers)]


def _numpy_view(t: paddle.Tensor):
    """A numpy array sharing the tensor's memory (bf16 as its uint16 bits: numpy has no bf16)."""
    import numpy as np

    if t.dtype == paddle.bfloat16:
        return np.from_dlpack(t.view(paddle.int16)).view(np.uint16)
    return np.from_dlpack(t)


def kv_block_views(cache_sets: list[list[tuple] | None], block_size: int):
    """The connector's views (kv_transfer.base.KVBlockViews) of every cache tensor in `cache_sets`
    (the target model's caches, then a draft model's if any), in a fixed order so a block read from
    one engine writes back into another engine with the same model and options."""
    from fdcli_engine.kv_transfer.base import KVBlockViews

    arrays = [_numpy_view(t) for caches in cache_sets if caches for layer in caches for t in layer]
    return KVBlockViews(arrays, block_size)
