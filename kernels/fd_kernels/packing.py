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
# GGUF block kinds: the file's blocks in panels of QNR columns, multiplied with 16-bit fixed-point
# activations on int8 units (see
# csrc/kernels.h for the record layout and csrc/qgemm_impl.h for the arithmetic; `qgemm_reference` below
# is the same arithmetic in numpy).
KIND_Q4_0, KIND_Q4_1, KIND_Q8_0 = 3, 4, 5
QNR, QBLOCK = 16, 32
_Q_ZERO = {KIND_Q4_0: 8, KIND_Q4_1: 0, KIND_Q8_0: 128}
WINT4_GROUP = 64

# GGUF / ggml tensor type ids this module consumes directly.
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q4_1, GGML_Q8_0 = 0, 1, 2, 3, 8
_GGML_BLOCK_BYTES = {GGML_Q4_0: 18, GGML_Q4_1: 20, GGML_Q8_0: 34}  # per 32 values


@dataclass
class Packed:
    """Host-side packed weight: what `fd_kernels.native.LinearWeight` uploads to Paddle."""

    kind: int
    in_features: int
    out_features: int
    group: int
    data: np.ndarray  # [panels, K, NR] (f32 / int8) or [panels, K, NR // 2] (uint8 nibbles)
    scales: np.ndarray  # [panels, groups, NR] float32 (1-element dummy for f32)
    mins: np.ndarray  # same shape as scales (1-element dummy unless u4)
    bias: np.ndarray | None  # [panels * NR] float32, zero padded

    def q_parts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
        """A GGUF block kind's (codes int32 [out, in], d float64 [out, blocks], m float64 or None, z): the
        weight is d * (code - z), plus m for Q4_1, per block of QBLOCK inputs."""
        if self.kind not in _Q_ZERO:
            raise ValueError(f"kind {self.kind} is not a GGUF block kind")
        k, n, four = self.in_features, self.out_features, self.kind != KIND_Q8_0
        nb = k // QBLOCK
        rec = self.data.reshape(-(-n // QNR), nb, -1)
        p = rec.shape[0]

        def halves(off: int) -> np.ndarray:  # fp16 [p, nb, QNR] -> float64 [out, nb]
            h = rec[..., off : off + 2 * QNR].copy().view(np.float16).astype(np.float64)
            return h.transpose(0, 2, 1).reshape(p * QNR, nb)[:n]

        d = halves(0)
        m = halves(2 * QNR) if self.kind == KIND_Q4_1 else None
        body = rec[..., (4 if m is not None else 2) * QNR :]
        if four:
            byte = body.reshape(p, nb, 4, QNR, 4)  # [p, block, chunk, column, j]
            codes = np.stack([byte & 15, byte >> 4], axis=3)  # [p, block, chunk, half, column, j]
            codes = codes.transpose(0, 4, 1, 2, 3, 5)  # k = 8 * chunk + 4 * half + j
        else:
            codes = body.reshape(p, nb, 8, QNR, 4).transpose(0, 3, 1, 2, 4)  # k = 4 * chunk + j
        codes = codes.reshape(p * QNR, k)[:n].astype(np.int32)
        return codes, d, m, _Q_ZERO[self.kind]

    def dequantize(self) -> np.ndarray:
        """The float32 [out, in] weight this packing represents (the kernel's exact operand; for the GGUF
        block kinds, what their integer products stand for). Computed in float64 and rounded once, as the
        kernel's fma(q, scale, min) rounds once."""
        k, n = self.in_features, self.out_features
        if self.kind in _Q_ZERO:
            codes, d, m, z = self.q_parts()
            blk = np.arange(k) // QBLOCK
            w = d[:, blk] * (codes - z)
            return (w if m is None else w + m[:, blk]).astype(np.float32)
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


def pack_wint8(
    weight: np.ndarray, bias: np.ndarray | None = None, row_scale: np.ndarray | None = None
) -> Packed:
    """Symmetric per-output-channel int8: scale = max|w_row| / 127, or `row_scale` where given (a column
    slice of a bigger weight quantized with its full rows' scales: the same codes as the whole)."""
    w = np.asarray(weight, dtype=np.float32)
    n, k = w.shape
    if row_scale is not None:
        scale = np.asarray(row_scale, dtype=np.float32).reshape(n)
    else:
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
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0]  # [n, k/32]
    mins = None
    if ggml_type == GGML_Q8_0:
        kind = KIND_Q8_0
        codes = (blocks[..., 2:].copy().view(np.int8).astype(np.int16) + 128).astype(np.uint8).reshape(n, k)
    else:
        kind = KIND_Q4_1 if ggml_type == GGML_Q4_1 else KIND_Q4_0
        if ggml_type == GGML_Q4_1:
            mins = blocks[..., 2:4].copy().view(np.float16)[..., 0]
        nib = blocks[..., 4:] if ggml_type == GGML_Q4_1 else blocks[..., 2:]
        codes = np.concatenate([nib & 15, nib >> 4], axis=-1).reshape(n, k)
    data = _q_records(codes, d, mins, four=kind != KIND_Q8_0)
    return Packed(kind, k, n, QBLOCK, data, _DUMMY, _DUMMY, _bias(bias, n))


def _q_records(codes: np.ndarray, d: np.ndarray, mins: np.ndarray | None, four: bool) -> np.ndarray:
    """codes uint8 [n, k], d / mins fp16 [n, k / QBLOCK] -> the flat uint8 records of csrc/kernels.h:
    per (panel of QNR columns, block): d[QNR], mins[QNR] if any, then the codes in vpdpbusd order."""
    n, k = codes.shape
    nb, p = k // QBLOCK, -(-n // QNR)

    def padded(a: np.ndarray) -> np.ndarray:
        out = np.zeros((p * QNR,) + a.shape[1:], dtype=a.dtype)
        out[:n] = a
        return out

    def halves(h: np.ndarray) -> np.ndarray:  # fp16 [n, nb] -> bytes [p, nb, 2 * QNR]
        return padded(h).reshape(p, QNR, nb).transpose(0, 2, 1).copy().view(np.uint8)

    c = padded(codes)
    if four:  # k = 8 * chunk + 4 * half + j; byte (column, j) of a chunk = low half | high half << 4
        c = c.reshape(p, QNR, nb, 4, 2, 4)
        body = (c[..., 0, :] | (c[..., 1, :] << 4)).transpose(0, 2, 3, 1, 4)
    else:  # k = 4 * chunk + j
        body = c.reshape(p, QNR, nb, 8, 4).transpose(0, 2, 3, 1, 4)
    parts = [halves(d)] + ([halves(mins)] if mins is not None else []) + [body.reshape(p, nb, -1)]
    return np.ascontiguousarray(np.concatenate(parts, axis=2)).reshape(-1)


def quantize_activations(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """x float32 [m, k] -> (Q int32 [m, k], da, s float32 [m, k / QBLOCK], sq int32): the kernel's
    16-bit fixed-point activations, per row and block, every step in float32 as the kernel rounds it:
    d = max|x| / 127, t = x * (1 / d), Q = rint(256 * t), da = d / 256, sq = sum(Q), s = da * sq."""
    x = np.asarray(x, dtype=np.float32)
    m, k = x.shape
    b = x.reshape(m, k // QBLOCK, QBLOCK)
    amax = np.abs(b).max(axis=2)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    t = (b * inv[..., None]).astype(np.float32)
    q = np.rint(t * np.float32(256)).astype(np.int32)
    sq = q.sum(axis=2)
    da = (d * np.float32(1 / 256)).astype(np.float32)
    s = (da * sq.astype(np.float32)).astype(np.float32)
    return q.reshape(m, k), da, s, sq


def qgemm_reference(x: np.ndarray, p: Packed) -> tuple[np.ndarray, np.ndarray]:
    """What the GGUF block kernel computes for x float32 [m, k], in float64 from the same integers and
    float32 factors: (y [m, n], magnitude [m, n]), where magnitude sums the absolute values of the terms
    the kernel adds in float32 (its rounding error is a small multiple of 2^-24 of it)."""
    codes, d, mins, z = p.q_parts()
    q, da, sa, sq = quantize_activations(x)
    m, k = q.shape
    nb = k // QBLOCK
    isum = np.einsum(
        "mbj,nbj->mnb",
        q.reshape(m, nb, QBLOCK).astype(np.int64),
        codes.reshape(-1, nb, QBLOCK).astype(np.int64),
    )
    isum -= z * sq[:, None, :].astype(np.int64)
    # The kernel multiplies d_w * da in float32 before the fma; so does the reference.
    scale = (d[None, :, :].astype(np.float32) * da[:, None, :]).astype(np.float64)
    terms = isum * scale
    mag = np.abs(terms).sum(axis=2)
    y = terms.sum(axis=2)
    if mins is not None:
        mt = mins[None, :, :] * sa[:, None, :].astype(np.float64)
        y += mt.sum(axis=2)
        mag += np.abs(mt).sum(axis=2)
    if p.bias is not None:
        y += p.bias[: p.out_features]
        mag += np.abs(p.bias[: p.out_features])
    return y, mag
