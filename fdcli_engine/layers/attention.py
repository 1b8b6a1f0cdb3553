"""Decoder self-attention over the paged KV cache: QKV matmul, optional per-head q/k RMSNorm (Qwen3),
rotary, cache write, paged attention, output projection."""

from __future__ import annotations

import paddle

from fdcli_engine import ops
from fdcli_engine.layers.linear import Linear, MergedLinear
from fdcli_engine.layers.norm import RMSNorm
from fdcli_engine.layers.rotary import RotaryEmbedding


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
    ):
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.q_size = num_heads * head_dim
        self.kv_size = num_kv_heads * head_dim
        self.scale = head_dim**-0.5
        self.rotary = rotary
        # Shards 0, 1, 2 = q_proj, k_proj, v_proj.
        self.qkv_proj = MergedLinear(
            hidden_size, [self.q_size, self.kv_size, self.kv_size], qkv_bias, quantization
        )
        self.o_proj = Linear(self.q_size, hidden_size, False, quantization)
        # Qwen3 normalizes each head's q and k (over head_dim) before rotary.
        self.q_norm = RMSNorm(head_dim, qk_norm_eps) if qk_norm_eps is not None else None
        self.k_norm = RMSNorm(head_dim, qk_norm_eps) if qk_norm_eps is not None else None

    def __call__(self, positions, hidden, kv_cache, meta):
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
        out = ops.paged_attention(q, k_cache, v_cache, meta, self.scale, *scales)
        return self.o_proj(out.reshape([num_tokens, self.q_size]), meta.prompt_rows)
