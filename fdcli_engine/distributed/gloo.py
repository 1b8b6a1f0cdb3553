"""`GlooGroup`: the collectives over Paddle's gloo process group, for ranks on several hosts.

The all-reduce is an all-gather followed by a sum in rank order on every rank, not gloo's own
all-reduce: gloo's ring adds the ranks' values in an order that depends on the chunk, so with three or
more ranks its sums differ from the rank-order sum in the last bits. Summing in rank order gives every
rank identical bits, and the same bits as `ShmGroup` (a model's output does not depend on which
transport carried it). Gloo's per-call latency, not its bandwidth, dominates at a decode step's sizes,
so the gather costs nothing that matters.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from fdcli_engine.distributed.rendezvous import Rendezvous, join

if TYPE_CHECKING:
    import paddle


def _dense(x: paddle.Tensor) -> paddle.Tensor:
    return x if x.is_contiguous() else x.contiguous()


def _axis(axis: int, ndim: int, op: str) -> int:
    if ndim == 0:
        raise ValueError(f"{op}: a 0-d tensor has no axis to gather along")
    if not -ndim <= axis < ndim:
        raise ValueError(f"{op}: axis {axis} is out of range for a {ndim}-d tensor")
    return axis % ndim


class GlooGroup:
    """A `ProcessGroup` over gloo. Every rank must call the same collectives in the same order with
    tensors of the same shape and dtype (the lockstep the tensor-parallel engine keeps)."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        master_addr: str,
        master_port: int,
        ranks_per_node: int = 1,
        timeout_s: float = 300.0,
        rendezvous: Rendezvous | None = None,
    ):
        from paddle.base import core  # noqa: PLC0415 - paddle loads only when a group is made

        self.rank, self.world_size = rank, world_size
        self._rv = rendezvous or join(rank, world_size, master_addr, master_port, ranks_per_node, timeout_s)
        self._pg = core.ProcessGroupGloo.create(self._rv.store, rank, world_size, 0)
        self._sum = core.ReduceOp.SUM

    def _gather(self, x: paddle.Tensor) -> paddle.Tensor:
        """[world_size, *x.shape]: every rank's x, in rank order."""
        import paddle  # noqa: PLC0415

        x = _dense(x)
        if math.prod(x.shape) == 0:
            return paddle.empty([self.world_size, *x.shape], dtype=x.dtype)
        out = paddle.empty([self.world_size * math.prod(x.shape)], dtype=x.dtype)
        self._pg.all_gather(out, x.reshape([-1]), True).wait()
        return out.reshape([self.world_size, *x.shape])

    def all_reduce(self, x: paddle.Tensor) -> paddle.Tensor:
        parts = self._gather(x)
        acc = parts[0]
        for r in range(1, self.world_size):
            acc = acc + parts[r]  # rank order: ((x0 + x1) + x2) + ...
        return acc

    def all_gather(self, x: paddle.Tensor, axis: int = -1) -> paddle.Tensor:
        import paddle  # noqa: PLC0415

        axis = _axis(axis, len(x.shape), "all_gather")
        parts = self._gather(x)
        if axis == 0:
            return parts.reshape([self.world_size * x.shape[0], *x.shape[1:]])
        return paddle.concat([parts[r] for r in range(self.world_size)], axis=axis)

    def barrier(self) -> None:
        self._pg.barrier().wait()

    def close(self) -> None:
        """Drop the process group and the store (rank 0 serves it: close it last where that matters)."""
        self._pg = None
        self._rv = None
