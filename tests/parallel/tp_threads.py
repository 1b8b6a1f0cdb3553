"""Tensor-parallel ranks as threads of one process: the oracle for the sharded layers and models,
without the engine. `ThreadGroup`s of one `ThreadRanks` meet at a barrier; all_reduce sums the ranks'
arrays in rank order in fp32 (as the process groups do), all_gather concatenates them in rank order.

`run_ranks(fns)` runs fns[r] on rank r's thread and returns their results (re-raising the first error);
`build_ranks(world_size, build)` builds one object per rank with `distributed.tp_group()` set to that
rank's group, as an engine process sets it before building its model."""

from __future__ import annotations

import threading

import numpy as np


class ThreadRanks:
    def __init__(self, world_size: int):
        self.world_size = world_size
        self.barrier = threading.Barrier(world_size, timeout=60)
        self.slots: list[np.ndarray | None] = [None] * world_size

    def exchange(self, rank: int, x) -> list[np.ndarray]:
        self.slots[rank] = x.numpy()
        self.barrier.wait()
        got = list(self.slots)
        self.barrier.wait()  # nobody overwrites a slot before every rank has read them all
        return got


class ThreadGroup:
    def __init__(self, ranks: ThreadRanks, rank: int):
        self.ranks = ranks
        self.rank = rank
        self.world_size = ranks.world_size

    def all_reduce(self, x):
        import paddle  # noqa: PLC0415

        parts = self.ranks.exchange(self.rank, x)
        total = parts[0].astype(np.float32, copy=True)
        for p in parts[1:]:
            total += p
        return paddle.to_tensor(total)

    def all_gather(self, x, axis: int = -1):
        import paddle  # noqa: PLC0415

        return paddle.to_tensor(np.concatenate(self.ranks.exchange(self.rank, x), axis=axis))

    def barrier(self) -> None:
        self.ranks.barrier.wait()


def build_ranks(world_size: int, build):
    """[build() with tp_group() = rank r's ThreadGroup, for r in ranks]."""
    from fdcli_engine.distributed import SingleRank, set_tp_group  # noqa: PLC0415

    ranks = ThreadRanks(world_size)
    out = []
    try:
        for r in range(world_size):
            set_tp_group(ThreadGroup(ranks, r))
            out.append(build())
    finally:
        set_tp_group(SingleRank())
    return out


def run_ranks(fns):
    results: list = [None] * len(fns)
    errors: list[BaseException] = []

    def target(i):
        try:
            results[i] = fns[i]()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=target, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results
