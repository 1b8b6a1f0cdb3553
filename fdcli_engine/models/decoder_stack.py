"""Packing a Llama-family decoder for `ops.decoder_stack`, the one-op forward of all its layers.

The per-op loop in DecoderForCausalLM.forward costs ~12 Python + Paddle dispatches per layer; the stack
runs the same kernels in the same order from C++ (kernels/fd_kernels/csrc/decoder_stack.cc), so its
output is bit-identical. It applies only where that is guaranteed by construction: the native kernels
are bound, every layer is the plain structure (Attention + GatedMLP between two RMSNorms, one shared
rotary table, one eps), and every linear is a native packed weight. Anything else (MoE layers, the
reference ops) returns None here and keeps the per-op loop, which stays the oracle. The plan also holds
the token table (the op then takes token ids) and the LM head (the op can end with each row's greedy
token, `ops.decoder_stack_greedy`), each where it is the plain lookup / linear those ops compute.

FD_DECODER_STACK=0 turns the stack off (debugging; the tests compare the two paths).
"""

from __future__ import annotations

import os

from fdcli_engine import ops
from fdcli_engine.layers import Attention, GatedMLP, RMSNorm
from fdcli_engine.layers.embedding import LMHead, VocabEmbedding


def stack_enabled() -> bool:
    return os.environ.get("FD_DECODER_STACK", "1") != "0"


def _norms(layer) -> list:
    attn = layer.self_attn
    extra = [attn.q_norm, attn.k_norm] if attn.q_norm is not None else []
    return [layer.input_layernorm, layer.post_attention_layernorm, *extra]


def _plain_layer(layer, rotary) -> bool:
    attn, mlp = layer.self_attn, layer.mlp
    if type(attn) is not Attention or type(mlp) is not GatedMLP or attn.rotary is not rotary:
        return False
    if (attn.q_norm is None) != (attn.k_norm is None):
        return False
    linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
    # A native LinearWeight has `packed`; anything else (not loaded, reference weights) disqualifies.
    if not all(lin.lw is not None and hasattr(lin.lw, "packed") for lin in linears):
        return False
    return all(type(n) is RMSNorm and n.weight is not None for n in _norms(layer))


def build_decoder_stack(model):
    """The packed stack for `model` (a DecoderForCausalLM after load_weights), or None where the per-op
    loop must run: reference ops, a layer of another structure, or a disabled stack."""
    if not stack_enabled() or ops.backend != "native" or ops.prepare_decoder_stack is None:
        return None
    layers = model.layers
    if not layers or type(model.norm) is not RMSNorm or model.norm.weight is None:
        return None
    rotary = layers[0].self_attn.rotary
    if not all(_plain_layer(layer, rotary) for layer in layers):
        return None
    eps = {n.eps for layer in layers for n in _norms(layer)} | {model.norm.eps}
    scales = {layer.self_attn.scale for layer in layers}
    if len(eps) != 1 or len(scales) != 1:
        return None
    packed = []
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        packed.append(
            {
                "input_norm": layer.input_layernorm.weight,
                "qkv": attn.qkv_proj.lw,
                "q_norm": attn.q_norm.weight if attn.q_norm is not None else None,
                "k_norm": attn.k_norm.weight if attn.k_norm is not None else None,
                "o_proj": attn.o_proj.lw,
                "post_norm": layer.post_attention_layernorm.weight,
                "gate_up": mlp.gate_up_proj.lw,
                "down": mlp.down_proj.lw,
            }
        )
    attn0 = layers[0].self_attn
    return ops.prepare_decoder_stack(
        packed,
        model.norm.weight,
        rotary.cos_sin_cache,
        attn0.num_heads,
        attn0.num_kv_heads,
        attn0.head_dim,
        eps.pop(),
        scales.pop(),
        embedding=_token_table(model.embed_tokens),
        head=_head_weight(model.lm_head),
    )


def _token_table(embed):
    """The embedding's table for the stack to look token rows up in (so a step is one op), or None
    where the lookup is not the plain one (another embedding class: the model keeps its own call)."""
    if type(embed) is not VocabEmbedding:
        return None
    return embed.lw if embed.lw is not None else embed.weight


def _head_weight(head):
    """The LM head's native weight for the stack's greedy tokens (`ops.decoder_stack_greedy`), or None
    where the head is not the plain linear its fused argmax takes."""
    if type(head) is not LMHead or head.lw is None or not hasattr(head.lw, "packed"):
        return None
    return head.lw
