"""Pure-Paddle reference implementations of fd's ops: the test oracle for the C++ kernels, and the
fallback when they cannot be built. Signatures are documented in fd_kernels' package docstring
(`fdcli_engine.ops` binds these or `fd_kernels.native`). `meta` is the step's attention metadata
(fdcli_engine.step_types.AttentionMetadata), read by attribute.

Correctness first, then op count: each eager Paddle op pays a fixed dispatch cost, so where it is free
to do so an op is written with fewer, larger Paddle calls.

Weight-only quantization is *simulated* here (quantize, then dequantize back to fp32) so the kernels'
integer GEMMs have an exact oracle. The schemes, which the kernels must reproduce bit for bit:
- "wint8": symmetric per output channel. scale[o] = max_i |w[o, i]| / 127 (a zero row gets scale 1);
  q = clip(round_half_even(w / scale), -127, 127); w' = q * scale.
- "wint4": symmetric per group of 64 consecutive `in` elements of one output row (the last group of a
  row whose `in` is not a multiple of 64 is shorter: zero padding does not change its absmax).
  scale[o, g] = max |w[o, 64g : 64g+64]| / 7 (a zero group gets scale 1);
  q = clip(round_half_even(w / scale), -7, 7); w' = q * scale.
- "gguf" and None: the weight is used as given (GGUF tensors arrive already dequantized).
`prepare_linear_gguf` takes a GGUF tensor's raw block rows instead; the reference dequantizes them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import paddle
import paddle.nn.functional as F

from fd_kernels.reference.sampler import sample  # noqa: F401 - the `sample` op is numpy

WINT4_GROUP_SIZE = 64


@dataclass
class RefLinear:
    """A prepared linear layer: `weight` fp32 [in, out] contiguous, `bias` fp32 [out] or None."""

    weight: paddle.Tensor
    bias: paddle.Tensor | None
    quantization: str | None = None

    @property
    def in_features(self) -> int:
        return int(self.weight.shape[0])

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[1])


def rms_norm(x: paddle.Tensor, weight: paddle.Tensor, eps: float) -> paddle.Tensor:
    variance = (x * x).mean(axis=-1, keepdim=True)
    return x * paddle.rsqrt(variance + eps) * weight


def fused_add_rms_norm(
    x: paddle.Tensor, residual: paddle.Tensor, weight: paddle.Tensor, eps: float
) -> tuple[paddle.Tensor, paddle.Tensor]:
    # The sum is returned so that the caller can carry it as the next layer's residual.
    summed = x + residual
    return rms_norm(summed, weight, eps), summed


def rotary_embedding(
    positions: paddle.Tensor,
    q: paddle.Tensor,
    k: paddle.Tensor,
    cos_sin_cache: paddle.Tensor,
    head_dim: int,
) -> tuple[paddle.Tensor, paddle.Tensor]:
    half = head_dim // 2
    cos_sin = paddle.index_select(cos_sin_cache, positions, axis=0)  # [T, hd]
    # [T, 1, half] so the same angles broadcast over every head.
    cos = cos_sin[:, :half].unsqueeze(1)
    sin = cos_sin[:, half:].unsqueeze(1)
    return _rotate(q, cos, sin, head_dim), _rotate(k, cos, sin, head_dim)


def _rotate(x: paddle.Tensor, cos: paddle.Tensor, sin: paddle.Tensor, head_dim: int) -> paddle.Tensor:
    # NeoX / HF layout: element i of the first half pairs with element i of the second half.
    num_tokens = x.shape[0]
    x = x.reshape([num_tokens, -1, head_dim])
    x1, x2 = paddle.split(x, 2, axis=-1)
    out = paddle.concat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.reshape([num_tokens, -1])


def silu_and_mul(x: paddle.Tensor) -> paddle.Tensor:
    gate, up = paddle.split(x, 2, axis=-1)
    return F.silu(gate) * up


# ---- encoder (BERT) ops


def gelu(x: paddle.Tensor) -> paddle.Tensor:
    return F.gelu(x)  # exact (erf) GELU, as BERT's hidden_act "gelu"


def add_layer_norm(
    x: paddle.Tensor, residual: paddle.Tensor, weight: paddle.Tensor, bias: paddle.Tensor, eps: float
) -> paddle.Tensor:
    return F.layer_norm(x + residual, [x.shape[-1]], weight, bias, eps)


def varlen_attention(
    q: paddle.Tensor, k: paddle.Tensor, v: paddle.Tensor, cu_seqlens: paddle.Tensor, scale: float
) -> paddle.Tensor:
    """One dense softmax(q k^T * scale) v per sequence, every token seeing every token of its sequence.
    A loop rather than one padded batch: on mixed lengths, padding to the longest sequence computes more
    than the loop saves in dispatch."""
    num_tokens, num_heads, head_dim = q.shape
    bounds = [int(b) for b in cu_seqlens.numpy()]
    outs = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end == start:
            continue
        qs, ks, vs = (t[start:end].transpose([1, 0, 2]) for t in (q, k, v))  # [nh, L, hd]
        probs = F.softmax(paddle.matmul(qs, ks, transpose_y=True) * scale, axis=-1)
        outs.append(paddle.matmul(probs, vs).transpose([1, 0, 2]))
    if not outs:
        return paddle.zeros([num_tokens, num_heads, head_dim], dtype=q.dtype)
    return outs[0] if len(outs) == 1 else paddle.concat(outs, axis=0)


def _fake_quant_wint8(w: np.ndarray, row_scale: np.ndarray | None = None) -> np.ndarray:
    if row_scale is not None:
        scale = np.asarray(row_scale, dtype=np.float32).reshape(-1, 1)
    else:
        scale = np.abs(w).max(axis=1, keepdims=True) / 127.0
        scale[scale == 0] = 1.0
    q = np.clip(np.round(w / scale), -127, 127)
    return (q * scale).astype(np.float32)


def _fake_quant_wint4(w: np.ndarray) -> np.ndarray:
    out_f, in_f = w.shape
    groups = -(-in_f // WINT4_GROUP_SIZE)
    padded = np.zeros((out_f, groups * WINT4_GROUP_SIZE), dtype=np.float32)
    padded[:, :in_f] = w
    g = padded.reshape(out_f, groups, WINT4_GROUP_SIZE)
    scale = np.abs(g).max(axis=2, keepdims=True) / 7.0
    scale[scale == 0] = 1.0
    q = np.clip(np.round(g / scale), -7, 7)
    return (q * scale).reshape(out_f, -1)[:, :in_f].astype(np.float32)


def prepare_linear(
    weight: np.ndarray, bias: np.ndarray | None, quantization: str | None, row_scale: np.ndarray | None = None
) -> RefLinear:
    """weight: fp32 [out, in] as in HF checkpoints. Stored transposed ([in, out]) so that `linear` is a
    plain matmul rather than Paddle's transpose_y path, the slower of the two on CPU. `row_scale`: wint8
    only, the per-row scales to quantize with (a column slice of a bigger weight keeps its rows')."""
    w = np.asarray(weight, dtype=np.float32)
    if w.ndim != 2:
        raise ValueError(f"linear weight must be 2-D [out, in], got shape {w.shape}")
    if row_scale is not None and quantization != "wint8":
        raise ValueError(f"row_scale applies to wint8 only, not {quantization!r}")
    if quantization == "wint8":
        w = _fake_quant_wint8(w, row_scale)
    elif quantization == "wint4":
        w = _fake_quant_wint4(w)
    elif quantization not in (None, "gguf"):
        raise ValueError(f"unknown quantization {quantization!r}: use wint8, wint4, gguf or None")
    w_t = paddle.to_tensor(np.ascontiguousarray(w.T))
    b = None if bias is None else paddle.to_tensor(np.asarray(bias, dtype=np.float32))
    return RefLinear(weight=w_t, bias=b, quantization=quantization)


def prepare_linear_gguf(
    raw: np.ndarray, ggml_type: int, in_features: int, bias: np.ndarray | None = None
) -> RefLinear:
    """A GGUF tensor's raw rows ([out, bytes_per_row] uint8, or [out, in] for F32/F16): dequantized with
    the gguf package, then used as fp32. Same signature as the native op, which keeps the blocks."""
    from gguf.quants import dequantize  # noqa: PLC0415 - only GGUF models need it

    w = np.asarray(dequantize(raw, ggml_type), dtype=np.float32).reshape(raw.shape[0], in_features)
    lw = prepare_linear(w, bias, None)
    lw.quantization = f"gguf:{ggml_type}"
    return lw


def linear(x: paddle.Tensor, lw: RefLinear, prompt_rows: paddle.Tensor | None = None) -> paddle.Tensor:
    # Every row is computed in fp32, prompt rows included: `prompt_rows` changes nothing here.
    # F.linear takes the weight as [in, out] and adds the bias in the same op.
    return F.linear(x, lw.weight, lw.bias)


def linear_argmax(x: paddle.Tensor, lw: RefLinear) -> list[int] | None:
    """Each row's first argmax of linear(x, lw) (numpy's, ties to the lowest index); None when a row
    holds a NaN."""
    logits = linear(x, lw).numpy()
    tokens = logits.argmax(axis=1)
    if np.isnan(logits[np.arange(len(tokens)), tokens]).any():
        return None
    return tokens.tolist()


def embedding(ids: paddle.Tensor, lw: RefLinear) -> paddle.Tensor:
    """Rows `ids` of the [out, in] weight (stored here as [in, out])."""
    rows = paddle.index_select(lw.weight, ids.flatten(), axis=1).T
    return rows.reshape([*ids.shape, lw.weight.shape[0]])


def _step_cache(meta, key: str, build):
    """Per-step values shared by every layer (block lists, masks), built by the first layer and kept on
    the step's AttentionMetadata, so they die with it. Relies on the runner building a new metadata
    object per step (it is a plain dataclass; nothing mutates one after construction)."""
    cache = meta.__dict__.setdefault("_reference_cache", {})
    if key not in cache:
        cache[key] = build()
    return cache[key]


def quantize_kv_s8(x: paddle.Tensor) -> tuple[paddle.Tensor, paddle.Tensor]:
    """The C8 cache's quantization of rows x[..., hd]: (int8 codes, fp32 scales x.shape[:-1]).
    scale = max |x| / 127 per row (1 if that is 0); q = clip(round_half_even(x / scale), -127, 127). The
    kernels (csrc/c8_impl.h) produce the same codes and scales bit for bit."""
    scale = paddle.divide(x.abs().max(axis=-1), paddle.full([], 127.0, dtype="float32"))
    scale = paddle.where(scale == 0, paddle.ones_like(scale), scale)
    q = paddle.clip(paddle.round(x / scale.unsqueeze(-1)), -127.0, 127.0).astype("int8")
    return q, scale


def round_bf16(x: paddle.Tensor) -> paddle.Tensor:
    """The bf16 cache's rounding of fp32 x: Paddle's CPU cast, which rounds to nearest even and turns every
    NaN into 0x7FFF; the kernels (csrc/simd.h bf16_bits) write the same bits, as the tests check."""
    return x.astype("bfloat16")


def reshape_and_cache(
    k: paddle.Tensor,
    v: paddle.Tensor,
    k_cache: paddle.Tensor,
    v_cache: paddle.Tensor,
    slot_mapping: paddle.Tensor,
    k_scales: paddle.Tensor | None = None,
    v_scales: paddle.Tensor | None = None,
) -> None:
    num_kv_heads, block_size = k_cache.shape[1], k_cache.shape[2]
    keep = slot_mapping >= 0  # a negative slot is a padding token: nothing to cache (as the kernels do)
    if not bool(keep.all()):
        rows = paddle.nonzero(keep).flatten()
        k, v, slot_mapping = paddle.gather(k, rows), paddle.gather(v, rows), paddle.gather(slot_mapping, rows)
    # Broadcast indices [T,1] x [1,nkv] x [T,1] address k_cache[block, head, offset, :] per token and head.
    block_idx = (slot_mapping // block_size).unsqueeze(1)
    offset = (slot_mapping % block_size).unsqueeze(1)
    head_idx = paddle.arange(num_kv_heads, dtype="int64").unsqueeze(0)
    if k_scales is not None:  # C8: int8 codes, one scale per (token, head)
        (k, ks), (v, vs) = quantize_kv_s8(k), quantize_kv_s8(v)
        k_scales.index_put_((block_idx, head_idx, offset), ks)
        v_scales.index_put_((block_idx, head_idx, offset), vs)
    elif k_cache.dtype == paddle.bfloat16:
        k, v = round_bf16(k), round_bf16(v)
    k_cache.index_put_((block_idx, head_idx, offset), k)
    v_cache.index_put_((block_idx, head_idx, offset), v)


def paged_attention(
    q: paddle.Tensor,
    k_cache: paddle.Tensor,
    v_cache: paddle.Tensor,
    meta,
    scale: float,
    k_scales: paddle.Tensor | None = None,
    v_scales: paddle.Tensor | None = None,
) -> paddle.Tensor:
    """One sequence at a time: gather its blocks into contiguous [nkv, L, hd] fp32 K/V (widened from a
    bf16 cache, dequantized from a C8 cache), then dense causal attention. Query i of a sequence with q_len
    queries and L keys sits at position L - q_len + i."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads, block_size = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    if meta.is_decode_only and meta.num_seqs == q.shape[0] and meta.num_seqs > 1:
        return _decode_batched(q, k_cache, v_cache, meta, scale, k_scales, v_scales)
    plan = _step_cache(meta, f"plan{block_size}/{group}", lambda: _attention_plan(meta, block_size, group))
    outs = []
    for start, end, seq_len, blocks, bias in plan:
        q_len = end - start
        k = _gather_seq(k_cache, blocks, num_kv_heads, seq_len, head_dim, k_scales)
        v = _gather_seq(v_cache, blocks, num_kv_heads, seq_len, head_dim, v_scales)
        # [q_len, nh, hd] -> [nkv, group * q_len, hd]: query heads h = kv * group + g share kv head kv.
        qs = q[start:end].transpose([1, 0, 2]).reshape([num_kv_heads, group * q_len, head_dim])
        scores = paddle.matmul(qs, k, transpose_y=True) * scale  # [nkv, group*q_len, L]
        if bias is not None:
            scores = scores + bias
        probs = F.softmax(scores, axis=-1)
        o = paddle.matmul(probs, v)  # [nkv, group*q_len, hd]
        outs.append(o.reshape([num_heads, q_len, head_dim]).transpose([1, 0, 2]))
    return outs[0] if len(outs) == 1 else paddle.concat(outs, axis=0)


def _gather_blocks(cache, blocks, scales) -> paddle.Tensor:
    """cache[blocks] as fp32: a bf16 cache widened (exact), a C8 cache's codes times their scales
    (index_select has no int8 kernel)."""
    if scales is None:
        x = paddle.index_select(cache, blocks, axis=0)
        return x.astype("float32") if x.dtype == paddle.bfloat16 else x
    codes = paddle.gather(cache, blocks, axis=0).astype("float32")
    return codes * paddle.gather(scales, blocks, axis=0).unsqueeze(-1)


def _decode_batched(q, k_cache, v_cache, meta, scale, k_scales=None, v_scales=None) -> paddle.Tensor:
    """All sequences decode one token: one padded batch instead of a loop (op count independent of B).
    Keys past a sequence's length (padding blocks, block id 0 in unused table entries) get -inf."""
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads, block_size = k_cache.shape[1], k_cache.shape[2]
    table, bias = _step_cache(meta, f"decode{block_size}", lambda: _decode_plan(meta, block_size))
    num_blocks = table.shape[0] // num_seqs

    def gather(cache, scales):  # -> [B, nkv, num_blocks * bs, hd]
        x = _gather_blocks(cache, table, scales)
        x = x.reshape([num_seqs, num_blocks, num_kv_heads, block_size, head_dim]).transpose([0, 2, 1, 3, 4])
        return x.reshape([num_seqs, num_kv_heads, num_blocks * block_size, head_dim])

    qs = q.reshape([num_seqs, num_kv_heads, num_heads // num_kv_heads, head_dim])
    # [B, nkv, group, L]
    scores = paddle.matmul(qs, gather(k_cache, k_scales), transpose_y=True) * scale + bias
    out = paddle.matmul(F.softmax(scores, axis=-1), gather(v_cache, v_scales))
    return out.reshape([num_seqs, num_heads, head_dim])


def _decode_plan(meta, block_size: int) -> tuple[paddle.Tensor, paddle.Tensor]:
    seq_lens = meta.seq_lens_np.astype(np.int64)
    num_blocks = int((seq_lens.max() + block_size - 1) // block_size)
    table = meta.block_tables.numpy()[:, :num_blocks].astype(np.int64)
    keys = np.arange(num_blocks * block_size)[None, :]
    bias = np.where(keys < seq_lens[:, None], 0.0, -np.inf).astype(np.float32)
    return paddle.to_tensor(table.reshape(-1)), paddle.to_tensor(bias[:, None, None, :])


def _attention_plan(meta, block_size: int, group: int) -> list[tuple]:
    """Per sequence with queries: (start, end, seq_len, its block ids as a tensor, causal bias or None)."""
    starts, seq_lens = meta.query_start_loc_np, meta.seq_lens_np
    block_tables = meta.block_tables.numpy()
    plan = []
    for b in range(meta.num_seqs):
        start, end, seq_len = int(starts[b]), int(starts[b + 1]), int(seq_lens[b])
        if end == start:
            continue
        num_blocks = (seq_len + block_size - 1) // block_size
        blocks = paddle.to_tensor(block_tables[b, :num_blocks].astype(np.int64))
        # A single query is the last position: it sees every key, so it needs no mask.
        bias = _causal_bias(end - start, seq_len, group) if end - start > 1 else None
        plan.append((start, end, seq_len, blocks, bias))
    return plan


def _gather_seq(cache, blocks, num_kv_heads, seq_len, head_dim, scales=None) -> paddle.Tensor:
    # [n, nkv, bs, hd] -> [nkv, n * bs, hd] -> first seq_len positions.
    x = _gather_blocks(cache, blocks, scales).transpose([1, 0, 2, 3])
    return x.reshape([num_kv_heads, -1, head_dim])[:, :seq_len]


def _causal_bias(q_len: int, seq_len: int, group: int) -> paddle.Tensor:
    q_pos = np.arange(seq_len - q_len, seq_len)[:, None]
    k_pos = np.arange(seq_len)[None, :]
    bias = np.where(k_pos <= q_pos, 0.0, -np.inf).astype(np.float32)
    return paddle.to_tensor(np.tile(bias, (group, 1)))


def huge_pages(tensors, touched: bool = True) -> int:
    """Memory advice has no reference: Paddle's own allocation stands, nothing is on huge pages."""
    return 0
