"""How a pool block is stored outside the pool: its parts as they are (bit-exact), or, with
`--kv-offload-compression int8`, fp32/bf16 K/V parts as the C8 cache stores them: int8 codes and one fp32
scale per (head, slot), absmax / 127 with round-half-even (fd_kernels.reference.quantize_kv_s8; the test
checks the two agree). A block restored from codes differs from the computed one by at most half a code
step per value, the C8 cache's own error, and a bf16 pool's values are then rounded to bf16 again.

Parts that are not fp32/bf16 (an int8 pool's codes and scales) are always stored as they are.
"""

from __future__ import annotations

import numpy as np


def _bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round to nearest even, as Paddle's CPU cast and the bf16 cache do (finite values)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16).astype(np.uint16)


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """C8 codes of rows x[..., hd] and their fp32 scales x.shape[:-1]."""
    scale = (np.abs(x).max(axis=-1) / np.float32(127.0)).astype(np.float32)
    scale[scale == 0] = 1.0
    q = np.clip(np.rint(x / scale[..., None]), -127, 127).astype(np.int8)
    return q, scale


class BlockCodec:
    """Encodes one block's parts (KVBlockViews.read) into arrays to store, and back. `spec` is the
    stored arrays' (shape, dtype) in order, so a file's payload splits without per-file metadata."""

    def __init__(self, views, compression: str | None):
        self.compression = compression
        self.kinds = []  # per pool part: "raw", "f32" or "bf16" (the last two compressed)
        self.spec: list[tuple[tuple[int, ...], np.dtype]] = []
        for a in views.arrays:
            shape, dtype = tuple(a.shape[1:]), a.dtype
            kind = "raw"
            if compression == "int8" and a.ndim >= 2 and dtype in (np.float32, np.uint16):
                kind = "f32" if dtype == np.float32 else "bf16"
            self.kinds.append(kind)
            if kind == "raw":
                self.spec.append((shape, dtype))
            else:
                self.spec += [(shape, np.dtype(np.int8)), (shape[:-1], np.dtype(np.float32))]
        self.nbytes = sum(int(np.prod(s)) * d.itemsize for s, d in self.spec)

    def encode(self, parts: list[np.ndarray]) -> list[np.ndarray]:
        out = []
        for kind, p in zip(self.kinds, parts):
            if kind == "raw":
                out.append(p)
            else:
                out += quantize_rows(_bf16_to_f32(p) if kind == "bf16" else p)
        return out

    def decode(self, stored: list[np.ndarray]) -> list[np.ndarray]:
        parts, i = [], 0
        for kind in self.kinds:
            if kind == "raw":
                parts.append(stored[i])
                i += 1
                continue
            x = stored[i].astype(np.float32) * stored[i + 1][..., None]
            parts.append(_f32_to_bf16(x) if kind == "bf16" else x)
            i += 2
        return parts

    def to_bytes(self, stored: list[np.ndarray]) -> bytes:
        return b"".join(np.ascontiguousarray(a).tobytes() for a in stored)

    def from_bytes(self, payload: bytes) -> list[np.ndarray] | None:
        """The stored arrays of a payload; None if its length is not this layout's."""
        if len(payload) != self.nbytes:
            return None
        out, off = [], 0
        for shape, dtype in self.spec:
            n = int(np.prod(shape)) * dtype.itemsize
            out.append(
                np.frombuffer(payload, dtype=dtype, count=n // dtype.itemsize, offset=off).reshape(shape)
            )
            off += n
        return out
