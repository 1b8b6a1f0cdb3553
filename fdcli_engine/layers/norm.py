"""RMSNorm, with the residual add fused in (the decoder carries `x + residual` between sublayers)."""

from __future__ import annotations

import numpy as np
import paddle

from fdcli_engine import ops


class RMSNorm:
    def __init__(self, hidden_size: int, eps: float):
        self.hidden_size = hidden_size
        self.eps = float(eps)
        self.weight = None

    @property
    def is_loaded(self) -> bool:
        return self.weight is not None

    def load(self, weight: np.ndarray) -> None:
        if tuple(weight.shape) != (self.hidden_size,):
            raise ValueError(f"norm weight shape {tuple(weight.shape)} != expected ({self.hidden_size},)")
        self.weight = paddle.to_tensor(np.asarray(weight, dtype=np.float32))

    def __call__(self, x, residual=None):
        """Without residual: normed x. With residual: (normed(x + residual), x + residual)."""
        if residual is None:
            return ops.rms_norm(x, self.weight, self.eps)
        return ops.fused_add_rms_norm(x, residual, self.weight, self.eps)
