"""Multimodal rotary embedding (M-RoPE, Qwen2-VL / Qwen2.5-VL): each token has three positions
(temporal, height, width); the head's rotary frequencies are cut into `mrope_section` runs
([t, h, w] counts summing to head_dim / 2), and run s turns by position s. Text tokens carry three
equal positions, which is plain rotary with that position.

Positions come as int64 [T] (every token's three positions equal: the decoder stack's fast path) or
int64 [3, T]. In the second case the step's own cos/sin table is gathered, row t holding token t's
angles, and the usual rotary op runs on it with positions 0..T-1.
"""

from __future__ import annotations

import numpy as np
import paddle

from fdcli_engine import ops
from fdcli_engine.layers.rotary import RotaryEmbedding


def mrope_section_of(cfg: dict) -> list[int] | None:
    """The config's mrope_section (rope_parameters in transformers 5, rope_scaling before), or None."""
    for key in ("rope_parameters", "rope_scaling"):
        params = cfg.get(key)
        if isinstance(params, dict) and params.get("mrope_section"):
            return [int(s) for s in params["mrope_section"]]
    return None


class MRotaryEmbedding(RotaryEmbedding):
    def __init__(self, head_dim: int, max_position: int, base: float, mrope_section: list[int]):
        super().__init__(head_dim, max_position, base, None)
        if sum(mrope_section) != head_dim // 2 or len(mrope_section) != 3:
            raise ValueError(
                f"mrope_section {mrope_section} must be 3 runs summing to head_dim / 2 ({head_dim // 2})"
            )
        self.mrope_section = list(mrope_section)
        # column j of the cos/sin table -> which of the three positions turns it
        half = np.repeat(np.arange(3), mrope_section)
        self._axis_of_column = np.concatenate([half, half])
        self._cache_np = self.cos_sin_cache.numpy()
        # The step's table, built once and shared by every layer (they all get the same positions).
        self._memo: tuple[object, paddle.Tensor, paddle.Tensor] | None = None

    def step_table(self, positions: np.ndarray) -> np.ndarray:
        """[T, head_dim] cos/sin rows of 3-D positions int64 [3, T]."""
        return self._cache_np[positions[self._axis_of_column].T, np.arange(self.head_dim)]

    def __call__(self, positions, q, k):
        if positions.ndim == 1:
            return ops.rotary_embedding(positions, q, k, self.cos_sin_cache, self.head_dim)
        if self._memo is None or self._memo[0] is not positions:
            table = paddle.to_tensor(self.step_table(positions.numpy()))
            self._memo = (positions, table, paddle.arange(positions.shape[1], dtype="int64"))
        _, table, rows = self._memo
        return ops.rotary_embedding(rows, q, k, table, self.head_dim)
