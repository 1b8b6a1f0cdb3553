"""Cutting one tensor-parallel rank's piece out of a checkpoint tensor, for every weight format.

A weight arrives whole ([out, in] fp32, or GGUF blocks: loader.gguf_io.QuantizedTensor, duck-typed here
through its `raw`, `ggml_type` and `shape`) and each rank keeps a contiguous run of rows (column
parallel: its output features) or of columns (row parallel: its input features). Rows of GGUF blocks
are whole tokens/features, so a row slice is exact; a column slice is exact at block boundaries (the
32 values of one block share a scale), and is refused elsewhere rather than re-quantized.

wint8 and wint4 are quantized after slicing (ops.prepare_linear), which is exact for rows; for columns
the layer passes the full row's wint8 scale (`full_row_scale`), so each rank's codes are the codes the
unsharded weight would have.
"""

from __future__ import annotations

import dataclasses

import numpy as np

GGUF_BLOCK = 32  # values per block of every GGUF type kept quantized (Q4_0, Q4_1, Q8_0)


def is_blocks(w) -> bool:
    return hasattr(w, "ggml_type")


def even_part(total: int, world_size: int, rank: int, what: str) -> tuple[int, int]:
    """[start, end) of rank's equal share of `total`; ValueError when it does not divide."""
    if total % world_size:
        raise ValueError(f"{what} {total} do not divide by tensor-parallel size {world_size}")
    size = total // world_size
    return rank * size, (rank + 1) * size


def padded_part(total: int, world_size: int, rank: int) -> tuple[int, int, int]:
    """(start, end, size): rank's run of ceil(total / world_size) entries, the last one cut at `total`
    (the vocabulary, which need not divide: the missing entries are padding)."""
    size = -(-total // world_size)
    start = min(rank * size, total)
    return start, min(start + size, total), size


def rows(w, start: int, end: int):
    """Rows [start, end) of an [out, in] (or [out]) weight of any format."""
    if is_blocks(w):
        return dataclasses.replace(w, raw=w.raw[start:end], shape=(end - start, *tuple(w.shape)[1:]))
    return np.ascontiguousarray(w[start:end])


def cols(w, start: int, end: int):
    """Columns [start, end) of an [out, in] weight of any format."""
    if not is_blocks(w):
        return np.ascontiguousarray(w[:, start:end])
    out, in_features = tuple(w.shape)
    if start % GGUF_BLOCK or end % GGUF_BLOCK:
        raise ValueError(
            f"GGUF blocks of {GGUF_BLOCK} values cannot be split at input feature {start}:{end} "
            f"of {in_features}: a tensor-parallel shard must hold whole blocks"
        )
    per_block = w.raw.shape[1] // (in_features // GGUF_BLOCK)
    raw = w.raw[:, start // GGUF_BLOCK * per_block : end // GGUF_BLOCK * per_block]
    return dataclasses.replace(w, raw=np.ascontiguousarray(raw), shape=(out, end - start))


def pad_rows(w, total: int):
    """`w` with zero rows appended up to `total` rows (a GGUF block of zero bytes is zero)."""
    n = tuple(w.shape)[0]
    if n == total:
        return w
    if is_blocks(w):
        raw = np.concatenate([w.raw, np.zeros((total - n, w.raw.shape[1]), dtype=w.raw.dtype)])
        return dataclasses.replace(w, raw=raw, shape=(total, *tuple(w.shape)[1:]))
    return np.concatenate([w, np.zeros((total - n, *w.shape[1:]), dtype=w.dtype)])


def full_row_scale(w: np.ndarray) -> np.ndarray:
    """The wint8 per-output-row scale of the whole weight (fd_kernels.packing.pack_wint8's)."""
    scale = np.abs(np.asarray(w, dtype=np.float32)).max(axis=1) / 127.0
    scale[scale == 0] = 1.0
    return scale.astype(np.float32)
