"""The gated MLP of Llama-family models: down(silu(gate(x)) * up(x)), gate and up as one matmul."""

from __future__ import annotations

from fdcli_engine import ops
from fdcli_engine.layers.linear import Linear, MergedLinear


class GatedMLP:
    def __init__(self, hidden_size: int, intermediate_size: int, quantization=None):
        # Shard 0 = gate_proj, shard 1 = up_proj: silu_and_mul applies SiLU to the first half.
        self.gate_up_proj = MergedLinear(hidden_size, [intermediate_size] * 2, False, quantization)
        self.down_proj = Linear(intermediate_size, hidden_size, False, quantization)

    def __call__(self, x, prompt_rows=None):
        return self.down_proj(ops.silu_and_mul(self.gate_up_proj(x, prompt_rows)), prompt_rows)
