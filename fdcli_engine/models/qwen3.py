"""Qwen3ForCausalLM: the Llama decoder with RMSNorm over each head's q and k (over head_dim, before
rotary), no QKV bias unless `attention_bias`, and an explicit `head_dim` that may differ from
hidden_size / num_heads."""

from __future__ import annotations

from fdcli_engine.models.decoder import DecoderForCausalLM


class Qwen3ForCausalLM(DecoderForCausalLM):
    layer_mapping = {
        **DecoderForCausalLM.layer_mapping,
        "self_attn.q_norm": ("self_attn.q_norm", None),
        "self_attn.k_norm": ("self_attn.k_norm", None),
    }
    qk_norm = True
