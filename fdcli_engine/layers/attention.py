"""Decoder self-attention over the paged KV cache: QKV matmul, optional per-head q/k RMSNorm (Qwen3),
rotary, cache write, paged attention, output projection.

Over a tensor-parallel group of T ranks each rank holds num_heads / T query heads and the
num_kv_heads / T KV heads they attend with (QKV column-parallel, heads contiguous by rank), so its KV
cache holds only those heads; o_proj is row-parallel and all-reduces. Heads that do not divide by T are
refused (parallel_config checks it before any weight is read)."""

from __future__ import annotations

import paddle

from fdcli_engine import ops
from fdcli_engine.layers.norm import RMSNorm
from fdcli_engine.layers.rotary import RotaryEmbedding
from fdcli_engine.layers.tp_linear import column_linear, row_linear


class Attention:
    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        rotary: RotaryEmbedding,
        qkv_bias: bool = False,
        qk_norm_eps: float | None = None,
        quantization=None,
        group=None,
    ):
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
        ws = group.world_size if group is not None else 1
        if num_kv_heads % ws:
            raise ValueError(f"{num_kv_heads} KV heads do not divide by tensor-parallel size {ws}")
        # This rank's heads (all of them without tensor parallelism).
        self.num_heads = num_heads // ws
        self.num_kv_heads = num_kv_heads // ws
        self.head_dim = head_dim
        self.q_size = self.num_heads * head_dim
        self.kv_size = self.num_kv_heads * head_dim
        self.scale = head_dim**-0.5
        self.rotary = rotary
        # Shards 0, 1, 2 = q_proj, k_proj, v_proj.
        full_q, full_kv = num_heads * head_dim, num_kv_heads * head_dim
        self.qkv_proj = column_linear(hidden_size, [full_q, full_kv, full_kv], qkv_bias, quantization, group)
        self.o_proj = row_linear(full_q, hidden_size, False, quantization, group)
        # Qwen3 normalizes each head's q and k (over head_dim) before rotary.
        self.q_norm = RMSNorm(head_dim, qk_norm_eps) if qk_norm_eps is not None else None
        self.k_norm = RMSNorm(head_dim, qk_norm_eps) if qk_norm_eps is not None else None

    def __call__(self, positions, hidden, kv_cache, meta, rows_meta=None):
        """Every row's QKV and cache write; then attention and o_proj over every row, or with `rows_meta`
        (meta.out, runner/read_rows.py) over those rows alone, which are returned."""
        num_tokens = hidden.shape[0]
        qkv = self.qkv_proj(hidden, meta.prompt_rows)
        q, k, v = paddle.split(qkv, [self.q_size, self.kv_size, self.kv_size], axis=-1)  # one op, not three
        if self.q_norm is not None:
            q = self.q_norm(q.reshape([-1, self.head_dim])).reshape([num_tokens, self.q_size])
            k = self.k_norm(k.reshape([-1, self.head_dim])).reshape([num_tokens, self.kv_size])
        q, k = self.rotary(positions, q, k)
        # (k_cache, v_cache), or for the C8 cache (k_cache, v_cache, k_scales, v_scales): runner/kv_cache.py.
        k_cache, v_cache, *scales = kv_cache
        k = k.reshape([num_tokens, self.num_kv_heads, self.head_dim])
        v = v.reshape([num_tokens, self.num_kv_heads, self.head_dim])
        ops.reshape_and_cache(k, v, k_cache, v_cache, meta.slot_mapping, *scales)
        q = q.reshape([num_tokens, self.num_heads, self.head_dim])
        if rows_meta is not None and rows_meta is not meta:
            meta = rows_meta
            num_tokens = meta.rows.shape[0]
            if num_tokens == 0:
                return paddle.zeros([0, hidden.shape[1]], dtype=hidden.dtype)
            q = paddle.gather(q, meta.rows)
        out = ops.paged_attention(q, k_cache, v_cache, meta, self.scale, *scales)
        return self.o_proj(out.reshape([num_tokens, self.q_size]), meta.prompt_rows)
