"""The group interface every collective implementation provides, and the single-rank one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import paddle


class ProcessGroup(Protocol):
    rank: int
    world_size: int

    def all_reduce(self, x: paddle.Tensor) -> paddle.Tensor:
        """The elementwise sum of `x` over the ranks (every rank gets it; `x` may be overwritten)."""

    def all_gather(self, x: paddle.Tensor, axis: int = -1) -> paddle.Tensor:
        """The ranks' `x` concatenated along `axis` in rank order (every rank gets it)."""

    def barrier(self) -> None: ...


class SingleRank:
    rank = 0
    world_size = 1

    def all_reduce(self, x):
        return x

    def all_gather(self, x, axis: int = -1):
        return x

    def barrier(self) -> None:
        return None


_tp_group: ProcessGroup = SingleRank()


def tp_group() -> ProcessGroup:
    return _tp_group


def set_tp_group(group: ProcessGroup) -> None:
    global _tp_group
    _tp_group = group
