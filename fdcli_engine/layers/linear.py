"""Linear layers over `ops.prepare_linear` / `ops.linear`.

Merged projections (QKV, gate_up) are one matmul: their HF weights are concatenated along `out` at load
time, in the order the layer declares, and the output is split by the caller. A plain `Linear` is the
one-shard case. Shards (and biases) arrive one by one from the checkpoint stream; the op weight is
prepared once every piece is present, and `is_loaded` tells the loader whether something is missing.
Shards may also be GGUF blocks (loader.gguf_io.QuantizedTensor, under --quantization gguf): kept as
blocks when every shard has the same block type, else dequantized.
"""

from __future__ import annotations

import numpy as np

from fdcli_engine import ops


class MergedLinear:
    """y = x @ concat(W_0, W_1, ..)^T (+ b). Plain Python class (no nn.Layer) to keep call overhead low."""

    def __init__(self, in_features: int, shard_sizes: list[int], bias: bool = False, quantization=None):
        self.in_features = in_features
        self.shard_sizes = list(shard_sizes)
        self.out_features = sum(self.shard_sizes)
        self.has_bias = bias
        self.quantization = quantization
        self.lw = None  # the prepared op weight, set once every shard has arrived
        self._weights: dict[int, np.ndarray] = {}
        self._biases: dict[int, np.ndarray] = {}

    @property
    def is_loaded(self) -> bool:
        return self.lw is not None

    def load_shard(self, shard: int, weight: np.ndarray | None = None, bias: np.ndarray | None = None):
        if weight is not None:
            expected = (self.shard_sizes[shard], self.in_features)
            if tuple(weight.shape) != expected:
                raise ValueError(f"weight shape {tuple(weight.shape)} != expected [out, in] {expected}")
            self._weights[shard] = weight
        if bias is not None:
            if tuple(bias.shape) != (self.shard_sizes[shard],):
                raise ValueError(f"bias shape {tuple(bias.shape)} != expected ({self.shard_sizes[shard]},)")
            self._biases[shard] = bias
        n = len(self.shard_sizes)
        if len(self._weights) == n and (not self.has_bias or len(self._biases) == n):
            shards = [self._weights[i] for i in range(n)]
            b = np.concatenate([self._biases[i] for i in range(n)]) if self.has_bias else None
            self.lw = self._prepare(shards, b)
            self._weights.clear()
            self._biases.clear()

    def _prepare(self, shards: list, bias: np.ndarray | None):
        raw_types = {getattr(w, "ggml_type", None) for w in shards}
        if len(raw_types) == 1 and None not in raw_types:
            # All shards are GGUF blocks of one type: rows concatenate as blocks, nothing is dequantized.
            raw = shards[0].raw if len(shards) == 1 else np.concatenate([w.raw for w in shards])
            return ops.prepare_linear_gguf(raw, raw_types.pop(), self.in_features, bias)
        dense = [w.dequantize() if hasattr(w, "ggml_type") else w for w in shards]
        w = dense[0] if len(dense) == 1 else np.concatenate(dense)
        return ops.prepare_linear(w, bias, self.quantization)

    def __call__(self, x, prompt_rows=None):
        """`prompt_rows`: the step's prompt-token rows (AttentionMetadata.prompt_rows), see ops.linear."""
        return ops.linear(x, self.lw, prompt_rows)


class Linear(MergedLinear):
    def __init__(self, in_features: int, out_features: int, bias: bool = False, quantization=None):
        super().__init__(in_features, [out_features], bias, quantization)
