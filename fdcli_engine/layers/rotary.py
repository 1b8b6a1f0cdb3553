"""Rotary position embedding (NeoX / HF rotate-half layout) with a precomputed cos/sin cache.

cos_sin_cache[p] = [cos(p * f_0 .. p * f_{hd/2-1}), sin(p * f_0 ..)], the layout `ops.rotary_embedding`
expects. Frequencies follow `rope_scaling`: None/"default", "linear" and "llama3"; any other type is a
ModelLoadError rather than silently wrong positions.
"""

from __future__ import annotations

import math

import numpy as np
import paddle

from fdcli_engine import ops
from fdcli_engine.errors import ModelLoadError

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def rope_inv_freq(head_dim: int, base: float, rope_scaling: dict | None) -> np.ndarray:
    """Inverse frequencies f_i = base^(-2i/hd), adjusted by the scaling scheme. float64 [hd/2]."""
    inv_freq = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    rope_type = _rope_type(rope_scaling)
    if rope_type == "default":
        return inv_freq
    factor = float(rope_scaling["factor"])
    if rope_type == "linear":
        return inv_freq / factor
    return _llama3_inv_freq(inv_freq, factor, rope_scaling)


def _rope_type(rope_scaling: dict | None) -> str:
    if not rope_scaling:
        return "default"
    rope_type = rope_scaling.get("rope_type") or rope_scaling.get("type") or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ModelLoadError(
            f"rope_scaling type {rope_type!r} is not supported: fd supports {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    return rope_type


def _llama3_inv_freq(inv_freq: np.ndarray, factor: float, cfg: dict) -> np.ndarray:
    # Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, the band between interpolated.
    low_freq_factor = float(cfg.get("low_freq_factor", 1.0))
    high_freq_factor = float(cfg.get("high_freq_factor", 4.0))
    old_len = float(cfg.get("original_max_position_embeddings", 8192))
    low_freq_wavelen = old_len / low_freq_factor
    high_freq_wavelen = old_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    out = np.where(wavelen > low_freq_wavelen, inv_freq / factor, blended)
    return np.where(wavelen < high_freq_wavelen, inv_freq, out)


class RotaryEmbedding:
    def __init__(self, head_dim: int, max_position: int, base: float, rope_scaling: dict | None = None):
        self.head_dim = head_dim
        self.max_position = max_position
        inv_freq = rope_inv_freq(head_dim, base, rope_scaling)
        # Angles in float64 then cast, so large positions keep their precision in the cache.
        angles = np.arange(max_position, dtype=np.float64)[:, None] * inv_freq[None, :]
        cache = np.concatenate([np.cos(angles), np.sin(angles)], axis=-1).astype(np.float32)
        self.cos_sin_cache = paddle.to_tensor(cache)

    def __call__(self, positions, q, k):
        return ops.rotary_embedding(positions, q, k, self.cos_sin_cache, self.head_dim)
