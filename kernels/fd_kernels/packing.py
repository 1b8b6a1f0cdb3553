"""Weight packing for the C++ linear kernel (numpy only; no compiler or Paddle needed).

The kernel reads weights in panels of NR = 32 output columns, each panel stored k-major so the inner loop
streams one contiguous row of 32 values per k (see csrc/kernels.h for the three encodings). Quantized
encodings carry one (scale, min) pair per column and group of `group` consecutive k's:
value = scale * q + min.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NR = 32
KIND_F32, KIND_S8, KIND_U4 = 0, 1, 2
WINT4_GROUP = 64

# GGUF / ggml tensor type ids this module consumes directly.
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q4_1, GGML_Q8_0 = 0, 1, 2, 3, 8
_GGML_BLOCK_BYTES = {GGML_Q4_0: 18, GGML_Q4_1: 20, GGML_Q8_0: 34}  # per 32 values


@dataclass
class Packed:
    """Host-side packed weight: what `fd_kernels.ops.LinearWeight` uploads to Paddle."""

    kind: int
    in_features: int
    out_features: int
    group: int
    data: np.ndarray  # [panels, K, NR] (f32 / int8) or [panels, K, NR // 2] (uint8 nibbles)
    scales: np.ndarray  # [panels, groups, NR] float32 (1-element dummy for f32)
    mins: np.ndarray  # same shape as scales (1-element dummy unless u4)
    bias: np.ndarray | None  # [panels * NR] float32, zero padded

    def dequantize(self) -> np.ndarray:
        """The float32 [out, in] weight this packing represents (the kernel's exact operand). Computed in
        float64 and rounded once, as the kernel's fma(q, scale, min) rounds once."""
        k, n = self.in_features, self.out_features
        if self.kind == KIND_U4:
            lo, hi = self.data & 15, self.data >> 4
            q = np.concatenate([lo, hi], axis=-1).astype(np.float64)
        else:
            q = self.data.astype(np.float64)
        if self.kind != KIND_F32:
            kidx = np.arange(k) // self.group
            q = q * self.scales[:, kidx, :]
            if self.kind == KIND_U4:
                q = q + self.mins[:, kidx, :]
        return q.transpose(0, 2, 1).reshape(-1, k)[:n].astype(np.float32)


def _panels(cols: np.ndarray) -> np.ndarray:
    """[N, X] per-column values -> [panels, X, NR], zero padded past N."""
    n = cols.shape[0]
    p = -(-n // NR)
    padded = np.zeros((p * NR,) + cols.shape[1:], dtype=cols.dtype)
    padded[:n] = cols
    return np.ascontiguousarray(padded.reshape(p, NR, -1).transpose(0, 2, 1))


def _nibbles(q: np.ndarray) -> np.ndarray:
    """[N, K] values 0..15 -> [panels, K, NR // 2]: byte j = column j | column j + 16 << 4."""
    p = _panels(q.astype(np.uint8))
    return np.ascontiguousarray(p[..., : NR // 2] | (p[..., NR // 2 :] << 4))


def _bias(bias: np.ndarray | None, n: int) -> np.ndarray | None:
    if bias is None:
        return None
    bias = np.asarray(bias, dtype=np.float32).reshape(-1)
    if bias.shape[0] != n:
        raise ValueError(f"bias has {bias.shape[0]} values for {n} output features")
    out = np.zeros(-(-n // NR) * NR, dtype=np.float32)
    out[:n] = bias
    return out


_DUMMY = np.zeros(1, dtype=np.float32)


def pack_f32(weight: np.ndarray, bias: np.ndarray | None = None) -> Packed:
    w = np.asarray(weight, dtype=np.float32)
    n, k = w.shape
    return Packed(KIND_F32, k, n, k, _panels(w), _DUMMY, _DUMMY, _bias(bias, n))


def pack_wint8(weight: np.ndarray, bias: np.ndarray | None = None) -> Packed:
    """Symmetric per-output-channel int8: scale = max|w_row| / 127."""
    w = np.asarray(weight, dtype=np.float32)
    n, k = w.shape
    scale = np.abs(w).max(axis=1) / 127.0
    scale[scale == 0] = 1.0  # an all-zero row quantizes to zeros with any scale
    q = np.clip(np.rint(w / scale[:, None]), -127, 127).astype(np.int8)
    return Packed(
        KIND_S8, k, n, k, _panels(q), _panels(scale[:, None].astype(np.float32)), _DUMMY, _bias(bias, n)
    )


def pack_wint4(weight: np.ndarray, bias: np.ndarray | None = None, group: int = WINT4_GROUP) -> Packed:
    """Symmetric int4 in groups of `group` along K: q in [-8, 7], stored as q + 8 with min = -8 * scale."""
    w = np.asarray(weight, dtype=np.float32)
    n, k = w.shape
    g = -(-k // group)
    wp = np.zeros((n, g * group), dtype=np.float32)
    wp[:, :k] = w
    scale = np.abs(wp.reshape(n, g, group)).max(axis=2) / 7.0
    scale[scale == 0] = 1.0
    q = np.clip(np.rint(wp.reshape(n, g, group) / scale[..., None]), -8, 7).reshape(n, -1)[:, :k]
    scales = scale.astype(np.float32)
    return Packed(
        KIND_U4, k, n, group, _nibbles(q + 8), _panels(scales), _panels(-8 * scales), _bias(bias, n)
    )


def pack_gguf(raw: np.ndarray, ggml_type: int, in_features: int, bias: np.ndarray | None = None) -> Packed:
    """Repack a GGUF tensor's raw rows ([out, bytes_per_row] uint8) without dequantizing Q4_0/Q4_1/Q8_0.

    Q8_0 block: fp16 d, 32 int8 (value d*q). Q4_0: fp16 d, 16 bytes (value d*(q-8)). Q4_1: fp16 d, fp16 m,
    16 bytes (value d*q + m). In both 4-bit blocks byte j holds element j (low nibble) and j+16 (high).
    """
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    n, k = raw.shape[0], in_features
    if ggml_type in (GGML_F32, GGML_F16):
        dt = np.float32 if ggml_type == GGML_F32 else np.float16
        return pack_f32(raw.view(dt).reshape(n, k).astype(np.float32), bias)
    if ggml_type not in _GGML_BLOCK_BYTES:
        raise ValueError(f"GGUF tensor type {ggml_type} is not supported by the native linear")
    if k % 32 or raw.shape[1] != (k // 32) * _GGML_BLOCK_BYTES[ggml_type]:
        raise ValueError(f"GGUF rows of {raw.shape[1]} bytes do not hold {k} values of type {ggml_type}")
    blocks = raw.reshape(n, k // 32, _GGML_BLOCK_BYTES[ggml_type])
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # [n, k/32]
    if ggml_type == GGML_Q8_0:
        q = blocks[..., 2:].copy().view(np.int8).reshape(n, k)
        return Packed(KIND_S8, k, n, 32, _panels(q), _panels(d), _DUMMY, _bias(bias, n))
    if ggml_type == GGML_Q4_1:
        mins = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        nib = blocks[..., 4:]
    else:
        mins = -8.0 * d
        nib = blocks[..., 2:]
    q = np.concatenate([nib & 15, nib >> 4], axis=-1).reshape(n, k)
    return Packed(
        KIND_U4, k, n, 32, _nibbles(q), _panels(d), _panels(mins.astype(np.float32)), _bias(bias, n)
    )
