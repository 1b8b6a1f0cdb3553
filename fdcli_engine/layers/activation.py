"""The gated MLP of Llama-family models: down(silu(gate(x)) * up(x)), gate and up as one matmul.

Over a tensor-parallel group, gate_up is column-parallel (each rank its run of the intermediate
features, gate and up alike) and down row-parallel; `reduce=False` leaves down's partial sum to the
caller (MoE sums its experts' partial outputs with one all-reduce)."""

from __future__ import annotations

from fdcli_engine import ops
from fdcli_engine.layers.tp_linear import column_linear, row_linear


class GatedMLP:
    def __init__(
        self, hidden_size: int, intermediate_size: int, quantization=None, group=None, reduce: bool = True
    ):
        # Shard 0 = gate_proj, shard 1 = up_proj: silu_and_mul applies SiLU to the first half.
        self.gate_up_proj = column_linear(hidden_size, [intermediate_size] * 2, False, quantization, group)
        self.down_proj = row_linear(intermediate_size, hidden_size, False, quantization, group, reduce)

    def __call__(self, x, prompt_rows=None):
        return self.down_proj(ops.silu_and_mul(self.gate_up_proj(x, prompt_rows)), prompt_rows)
