"""How a pool block is stored outside the pool: its parts as they are (bit-exact), or, with
`--kv-offload-compression int8`, fp32/bf16 K/V parts as the C8 cache stores them: int8 codes and one fp32
scale per (head, slot), absmax / 127 with round-half-even (fd_kernels.reference.quantize_kv_s8; the test
checks the two agree). A block restored from codes differs from the computed one by at most half a code
step per value, the C8 cache's own error, and a bf16 pool's values are then rounded to bf16 again.

Compressed parts of one kind and shape (every layer's K and V, and a draft model's) form a group, stored
as one codes array [parts, ...] and one scales array: a block is quantized and restored in one call per
group (the native kernels' C8 rule, fd_kernels.native.kv_s8, when fd runs its native ops; numpy
otherwise), through one preallocated scratch per group, so a restore is the rule's pass and the copy
of each part into the pool. Parts that are not fp32/bf16 (an int8 pool's codes and scales) are always
stored as they are. Encoding and decoding run on the engine thread only (the scratch is not shared).
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
    """C8 codes of rows x[..., hd] and their fp32 scales x.shape[:-1] (numpy)."""
    scale = (np.abs(x).max(axis=-1) / np.float32(127.0)).astype(np.float32)
    scale[scale == 0] = 1.0
    q = np.clip(np.rint(x / scale[..., None]), -127, 127).astype(np.int8)
    return q, scale


def _numpy_quantize(x, codes, scales) -> None:
    """fd_kernels.native.kv_s8's rule in numpy: x fp32, or bf16 bits (uint16)."""
    codes[...], scales[...] = quantize_rows(_bf16_to_f32(x) if x.dtype == np.uint16 else x)


def _numpy_dequantize(codes, scales, out) -> None:
    if out.dtype == np.uint16:
        out[...] = _f32_to_bf16(codes * scales[..., None])
    else:
        np.multiply(codes, scales[..., None], out=out)


def _row_rule():
    """(quantize, dequantize) into preallocated arrays: the native kernels' when fd runs them."""
    from fdcli_engine import ops  # noqa: PLC0415 - bound by the time a connector binds

    if ops.backend == "native":
        from fd_kernels.native import kv_s8  # noqa: PLC0415

        return kv_s8.kv_s8_quantize, kv_s8.kv_s8_dequantize
    return _numpy_quantize, _numpy_dequantize


class _Group:
    """Compressed parts of one dtype (fp32, or bf16 bits as uint16) and per-part shape, in part order."""

    def __init__(self, dtype, shape: tuple[int, ...], parts: list[int]):
        self.shape, self.parts = shape, parts
        self.full = (len(parts), *shape)
        self.x = np.empty(self.full, dtype)  # scratch: the group's values as the pool holds them


class BlockCodec:
    """Encodes one block's parts (KVBlockViews.read, or views of the pool) into arrays to store, and
    back. `spec` is the stored arrays' (shape, dtype) in order, so a file's payload splits without
    per-file metadata: raw parts in pool order, then each group's codes and scales."""

    def __init__(self, views, compression: str | None, row_rule=None):
        self.compression = compression
        self.raw: list[int] = []
        groups: dict[tuple, list[int]] = {}
        for i, a in enumerate(views.arrays):
            if compression == "int8" and a.ndim >= 2 and a.dtype in (np.float32, np.uint16):
                groups.setdefault((a.dtype, tuple(a.shape[1:])), []).append(i)
            else:
                self.raw.append(i)
        self.groups = [_Group(dtype, shape, parts) for (dtype, shape), parts in groups.items()]
        self.spec: list[tuple[tuple[int, ...], np.dtype]] = [
            (tuple(views.arrays[i].shape[1:]), views.arrays[i].dtype) for i in self.raw
        ]
        for g in self.groups:
            self.spec += [(g.full, np.dtype(np.int8)), (g.full[:-1], np.dtype(np.float32))]
        self.nbytes = sum(int(np.prod(s)) * d.itemsize for s, d in self.spec)
        self._quantize, self._dequantize = row_rule or (_row_rule() if self.groups else (None, None))

    def encode_block(self, views, block_id: int) -> list[np.ndarray]:
        """The stored arrays of pool block `block_id`, read straight from the views."""
        return self.encode([a[block_id] for a in views.arrays])

    def encode(self, parts: list[np.ndarray]) -> list[np.ndarray]:
        out = [np.array(parts[i]) for i in self.raw]
        for g in self.groups:
            np.stack([parts[i] for i in g.parts], out=g.x)
            codes, scales = np.empty(g.full, np.int8), np.empty(g.full[:-1], np.float32)
            self._quantize(g.x, codes, scales)
            out += [codes, scales]
        return out

    def _decoded(self, stored: list[np.ndarray]):
        """(part index, value) of every part; a group's values are its scratch, valid until the next
        call."""
        yield from zip(self.raw, stored)
        k = len(self.raw)
        for g in self.groups:
            codes, scales = stored[k], stored[k + 1]
            k += 2
            self._dequantize(codes, scales, g.x)
            yield from zip(g.parts, g.x)

    def decode_into(self, stored: list[np.ndarray], views, block_id: int) -> None:
        """Write a stored block into pool block `block_id` through the views."""
        for i, value in self._decoded(stored):
            views.arrays[i][block_id] = value

    def decode(self, stored: list[np.ndarray]) -> list[np.ndarray]:
        parts: list = [None] * (len(self.raw) + sum(len(g.parts) for g in self.groups))
        for i, value in self._decoded(stored):
            parts[i] = np.array(value)
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
