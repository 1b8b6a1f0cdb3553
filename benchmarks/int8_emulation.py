"""Numpy emulation of prompt-row GEMMs over GGUF Q4_1 / Q8_0 weights, for the int8-activation accuracy
measurement (benchmarks/int8_activation_accuracy.py):

- `bf16_path`: today's AMX prompt rows (csrc/amx.cc): bf16(x) times bf16 of the dequantized weight, the
  products summed exactly here (float64), as the kernel's fp32 accumulation of exact bf16 products.
- `int8_path`: AMX-INT8 as it would run (tdpbusd / tdpbssd): activation codes q in [-127, 127] with one
  scale per row ("row") or per row and 32-column block ("block"), times the weights' own codes, summed per
  32-column block as integers, then scaled per block by float32(s_x * d_w); Q4_1 adds its min term
  m_w * s_x * sum(q) per block.
- "block16": the 16-bit fixed point the GGUF decode rows already use (csrc/qgemm_impl.h), per block.
- `fake_quant`: the same activation rounding as a float operand (q * s_x), for a float forward pass; its
  product with the dequantized weight equals `int8_path` up to the final scaling's rounding.

Blocks are GGUF's: QK = 32 values along the input dimension, fp16 d (and m for Q4_1) per block."""

from __future__ import annotations

import numpy as np

QK = 32
Q4_1, Q8_0 = 3, 8  # GGMLQuantizationType values


def parse_blocks(raw: np.ndarray, qtype: int, n: int, k: int):
    """Raw GGUF blocks (uint8 [n, bytes]) -> (codes int32 [n, k], d float64 [n, k/32], m or None): the
    weight is d * code (+ m) per block."""
    nb = k // QK
    rec = np.ascontiguousarray(raw).view(np.uint8).reshape(n, nb, -1)
    d = rec[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
    if qtype == Q4_1:
        m = rec[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
        qs = rec[..., 4:20]
        codes = np.concatenate([qs & 15, qs >> 4], axis=2)  # value j: low nibble j, value 16 + j: high
        return codes.reshape(n, k).astype(np.int32), d, m
    if qtype == Q8_0:
        codes = rec[..., 2:34].copy().view(np.int8)
        return codes.reshape(n, k).astype(np.int32), d, None
    raise ValueError(f"GGUF type {qtype} is not emulated (Q4_1 and Q8_0 are)")


def dequantize(codes: np.ndarray, d: np.ndarray, m: np.ndarray | None) -> np.ndarray:
    """The float32 weight the blocks stand for (float64 d * code + m, rounded once)."""
    n, k = codes.shape
    w = codes.reshape(n, -1, QK) * d[..., None]
    if m is not None:
        w = w + m[..., None]
    return w.reshape(n, k).astype(np.float32)


def bf16(a: np.ndarray) -> np.ndarray:
    """float32 rounded to bf16 (nearest even), kept as float32."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def quantize_int8(x: np.ndarray, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """x float32 [m, k] -> (q int32 [m, k] in [-127, 127], s float32 [m, k/32]): symmetric, s = amax / 127
    over the row ("row") or over each 32-column block of the row ("block"); q = rint(x / s). "block16":
    the decode rows' 16-bit fixed point (packing.quantize_activations), s = amax / (127 * 256) per block
    and q in [-32512, 32512], which AMX-INT8 would multiply as two int8 planes (q = 256 * hi + lo)."""
    x = np.asarray(x, dtype=np.float32)
    rows, k = x.shape
    b = x.reshape(rows, k // QK, QK)
    if mode == "row":
        amax = np.repeat(np.abs(x).max(axis=1, keepdims=True), k // QK, axis=1)
    elif mode in ("block", "block16"):
        amax = np.abs(b).max(axis=2)
    else:
        raise ValueError(mode)
    s = (amax / np.float32(127 * 256 if mode == "block16" else 127)).astype(np.float32)
    safe = np.where(s > 0, s, np.float32(1))
    q = np.rint(b / safe[..., None]).astype(np.int32)
    return q.reshape(rows, k), s


def fake_quant(x: np.ndarray, mode: str) -> np.ndarray:
    """The activations int8 rounding leaves, as float32 (q * s)."""
    q, s = quantize_int8(x, mode)
    rows, k = q.shape
    return (q.reshape(rows, -1, QK) * s[..., None].astype(np.float64)).reshape(rows, k).astype(np.float32)


def int8_path(x: np.ndarray, codes: np.ndarray, d: np.ndarray, m: np.ndarray | None, mode: str) -> np.ndarray:
    """y [rows, n] float64 as AMX-INT8 would compute x @ W^T: integer block sums, float32 block scales."""
    q, s = quantize_int8(x, mode)
    rows, k = q.shape
    nb = k // QK
    qb = q.reshape(rows, nb, QK).astype(np.float64)  # integers: float64 products and sums are exact
    cb = codes.reshape(-1, nb, QK).astype(np.float64)
    y = np.zeros((rows, codes.shape[0]))
    for b in range(nb):
        isum = qb[:, b] @ cb[:, b].T  # |isum| <= 32 * 32512 * 128 < 2^31: an int32 accumulator holds it
        scale = (s[:, b, None] * d[None, :, b].astype(np.float32)).astype(np.float32)
        y += isum * scale
        if m is not None:
            sx = (s[:, b] * qb[:, b].sum(axis=1).astype(np.float32)).astype(np.float32)
            y += sx[:, None].astype(np.float64) * m[None, :, b]
    return y


def bf16_path(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """y [rows, n] float64 of today's AMX prompt rows: bf16(x) @ bf16(w)^T with exact products."""
    return bf16(x).astype(np.float64) @ bf16(w).astype(np.float64).T
