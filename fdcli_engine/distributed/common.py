"""What both collective groups share: their error, input normalization, and the rank-order sum and
concatenation that make every rank's result the same bits."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fdcli_engine.errors import FdError

if TYPE_CHECKING:
    import paddle


class CollectiveError(FdError):
    """A collective that could not complete: a rank died or stopped answering. The group is unusable
    afterwards (the ranks no longer agree on how many collectives they have run)."""


def dense(x: paddle.Tensor) -> paddle.Tensor:
    """x itself when contiguous, else a contiguous copy (the transports read raw memory)."""
    return x if x.is_contiguous() else x.contiguous()


def gather_axis(axis: int, ndim: int) -> int:
    if ndim == 0:
        raise ValueError("all_gather: a 0-d tensor has no axis to gather along")
    if not -ndim <= axis < ndim:
        raise ValueError(f"all_gather: axis {axis} is out of range for a {ndim}-d tensor")
    return axis % ndim


def rank_order_sum(parts: paddle.Tensor) -> paddle.Tensor:
    """parts [world, ...] -> ((parts[0] + parts[1]) + parts[2]) + ...: one fixed order, so every rank
    gets the same bits whatever transport gathered the parts."""
    acc = parts[0]
    for r in range(1, parts.shape[0]):
        acc = acc + parts[r]
    return acc


def concat_parts(parts: paddle.Tensor, axis: int) -> paddle.Tensor:
    """parts [world, *shape] -> the ranks' tensors concatenated along `axis` of shape, in rank order."""
    import paddle  # noqa: PLC0415

    world, shape = parts.shape[0], parts.shape[1:]
    if axis == 0:
        return parts.reshape([world * shape[0], *shape[1:]])
    return paddle.concat([parts[r] for r in range(world)], axis=axis)
