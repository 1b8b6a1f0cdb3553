"""Tensor-parallel linears (Megatron's split, as vLLM and FastDeploy name them).

- `ColumnParallelLinear`: each rank holds a contiguous run of every shard's output rows, so a merged
  QKV keeps its heads (q heads r*nh/T.., and the KV heads they attend with, r*nkv/T..) and a merged
  gate_up its halves; the output stays this rank's slice, no communication.
- `RowParallelLinear`: each rank holds a run of the input columns and sums its partial product with the
  others' (`all_reduce`, unless the caller reduces once for several: MoE). A bias is added on rank 0
  only, so it is counted once.

Both take the checkpoint's whole tensors (shape-checked against the unsharded layer) and keep only this
rank's piece (layers/tp_shard.py says what is exact for each weight format).
"""

from __future__ import annotations

import numpy as np

from fdcli_engine import ops
from fdcli_engine.distributed import ProcessGroup
from fdcli_engine.layers import tp_shard
from fdcli_engine.layers.linear import Linear, MergedLinear


def _check_full(weight, expected: tuple[int, int]) -> None:
    if tuple(weight.shape) != expected:
        raise ValueError(f"weight shape {tuple(weight.shape)} != expected [out, in] {expected}")


class ColumnParallelLinear(MergedLinear):
    def __init__(
        self,
        in_features: int,
        shard_sizes: list[int],
        bias: bool = False,
        quantization=None,
        group: ProcessGroup | None = None,
    ):
        self.group = group
        ws, rank = group.world_size, group.rank
        self.full_sizes = list(shard_sizes)
        self._parts = [tp_shard.even_part(s, ws, rank, "output features") for s in shard_sizes]
        super().__init__(in_features, [b - a for a, b in self._parts], bias, quantization)

    def load_shard(self, shard: int, weight=None, bias=None):
        a, b = self._parts[shard]
        if weight is not None:
            _check_full(weight, (self.full_sizes[shard], self.in_features))
            weight = tp_shard.rows(weight, a, b)
        if bias is not None:
            if tuple(bias.shape) != (self.full_sizes[shard],):
                raise ValueError(f"bias shape {tuple(bias.shape)} != expected ({self.full_sizes[shard]},)")
            bias = np.ascontiguousarray(bias[a:b])
        super().load_shard(shard, weight, bias)


class RowParallelLinear(MergedLinear):
    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        quantization=None,
        group: ProcessGroup | None = None,
        reduce: bool = True,
    ):
        self.group = group
        self.reduce = reduce
        self.full_in = in_features
        self._part = tp_shard.even_part(in_features, group.world_size, group.rank, "input features")
        self._row_scale = None
        super().__init__(self._part[1] - self._part[0], [out_features], bias, quantization)

    def load_shard(self, shard: int, weight=None, bias=None):
        if weight is not None:
            _check_full(weight, (self.out_features, self.full_in))
            if self.quantization == "wint8" and not tp_shard.is_blocks(weight):
                self._row_scale = tp_shard.full_row_scale(weight)
            weight = tp_shard.cols(weight, *self._part)
        if bias is not None and self.group.rank != 0:
            bias = np.zeros_like(bias)  # the bias is rank 0's: the all-reduce adds it once
        super().load_shard(shard, weight, bias)

    def _prepare(self, shards: list, bias):
        if self._row_scale is None:
            return super()._prepare(shards, bias)
        return ops.prepare_linear(shards[0], bias, self.quantization, row_scale=self._row_scale)

    def __call__(self, x, prompt_rows=None):
        y = ops.linear(x, self.lw, prompt_rows)
        return self.group.all_reduce(y) if self.reduce else y


def column_linear(in_features, shard_sizes, bias, quantization, group):
    """A MergedLinear, column-parallel over `group` when it has several ranks."""
    if group is None or group.world_size == 1:
        return MergedLinear(in_features, shard_sizes, bias, quantization)
    return ColumnParallelLinear(in_features, shard_sizes, bias, quantization, group)


def row_linear(in_features, out_features, bias, quantization, group, reduce: bool = True):
    """A Linear, row-parallel over `group` when it has several ranks."""
    if group is None or group.world_size == 1:
        return Linear(in_features, out_features, bias, quantization)
    return RowParallelLinear(in_features, out_features, bias, quantization, group, reduce)
