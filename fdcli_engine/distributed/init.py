"""`init_tp_group`: the collective group of one tensor-parallel engine, chosen from where its ranks run.

All ranks on this host (world_size <= ranks_per_node): `ShmGroup`, the shared-memory collectives of
fd_kernels, because gloo's per-call latency exceeds a decode step's budget for its all-reduces. Ranks
on several hosts: `GlooGroup`. A rank that never joins fails every rank with a ConfigError naming it.
"""

from __future__ import annotations

from fdcli_engine.distributed.group import ProcessGroup, SingleRank
from fdcli_engine.errors import ConfigError

BACKENDS = ("shm", "gloo")


def _check(rank: int, world_size: int, master_port: int, ranks_per_node: int, timeout_s: float) -> None:
    if world_size < 1:
        raise ConfigError(f"tensor-parallel world size must be at least 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ConfigError(f"tensor-parallel rank {rank} is outside 0..{world_size - 1}")
    if ranks_per_node < 1:
        raise ConfigError(f"ranks per node must be at least 1, got {ranks_per_node}")
    if not 0 < master_port < 65536:
        raise ConfigError(f"master port {master_port} is not a TCP port (1-65535)")
    if timeout_s <= 0:
        raise ConfigError(f"the group's timeout must be positive, got {timeout_s:g} s")


def init_tp_group(
    rank: int,
    world_size: int,
    master_addr: str,
    master_port: int,
    ranks_per_node: int,
    timeout_s: float,
    backend: str | None = None,
) -> ProcessGroup:
    """Join the group of `world_size` ranks whose rank 0 listens at master_addr:master_port.

    `backend` forces "shm" or "gloo" (benchmarks, tests); None chooses as the module docstring says.
    """
    _check(rank, world_size, master_port, ranks_per_node, timeout_s)
    if backend is not None and backend not in BACKENDS:
        raise ConfigError(f"unknown collective backend {backend!r}: use one of {', '.join(BACKENDS)}")
    if world_size == 1:
        return SingleRank()
    one_host = world_size <= ranks_per_node
    if backend is None:
        backend = "shm" if one_host else "gloo"
    if backend == "shm":
        if not one_host:
            raise ConfigError(
                f"shared-memory collectives need every rank on one host ({world_size} ranks, "
                f"{ranks_per_node} per node)"
            )
        from fdcli_engine.distributed.shm import ShmGroup  # noqa: PLC0415

        return ShmGroup(rank, world_size, master_addr, master_port, timeout_s=timeout_s)
    from fdcli_engine.distributed.gloo import GlooGroup  # noqa: PLC0415

    return GlooGroup(rank, world_size, master_addr, master_port, ranks_per_node, timeout_s)
