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

from fdcli_engine.distributed.common import CollectiveError, concat_parts, dense, gather_axis, rank_order_sum
from fdcli_engine.distributed.rendezvous import Rendezvous, join

if TYPE_CHECKING:
    import paddle


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
        self._address = self._rv.address
        try:
            self._pg = core.ProcessGroupGloo.create(self._rv.store, rank, world_size, 0)
        except RuntimeError as exc:  # a peer that died while the pairs connect: gloo's TIMEOUT
            raise self._error("set-up", exc) from None

    def _gather(self, x: paddle.Tensor, op: str) -> paddle.Tensor:
        """[world_size, *x.shape]: every rank's x, in rank order."""
        import paddle  # noqa: PLC0415

        x = dense(x)
        n = math.prod(x.shape)
        if n == 0:
            return paddle.empty([self.world_size, *x.shape], dtype=x.dtype)
        out = paddle.empty([self.world_size * n], dtype=x.dtype)
        self._run(op, lambda pg: pg.all_gather(out, x.reshape([-1]), True))
        return out.reshape([self.world_size, *x.shape])

    def _run(self, op: str, call) -> None:
        """Run one gloo call; a peer that died (gloo: "Connection reset by peer") -> CollectiveError."""
        if self._pg is None:
            raise CollectiveError(
                f"tensor-parallel {op}: the gloo group at {self._address} is closed or broken"
            )
        try:
            call(self._pg).wait()
        except RuntimeError as exc:
            self._pg = None
            raise self._error(op, exc) from None

    def _error(self, op: str, exc: RuntimeError) -> CollectiveError:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return CollectiveError(
            f"tensor-parallel {op} over gloo failed (a rank died or left; this is rank {self.rank} of "
            f"{self.world_size}, group at {self._address}): {first}"
        )

    def all_reduce(self, x: paddle.Tensor) -> paddle.Tensor:
        return rank_order_sum(self._gather(x, "all_reduce"))

    def all_gather(self, x: paddle.Tensor, axis: int = -1) -> paddle.Tensor:
        axis = gather_axis(axis, len(x.shape))  # before the collective: a bad axis fails every rank alike
        return concat_parts(self._gather(x, "all_gather"), axis)

    def barrier(self) -> None:
        self._run("barrier", lambda pg: pg.barrier())

    def close(self) -> None:
        """Drop the process group and the store (rank 0 serves it: close it last where that matters)."""
        self._pg = None
        self._rv = None
