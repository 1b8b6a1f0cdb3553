"""One data-parallel rank as the front end sees it: its engine-core process, and what it owes.

Each rank is a whole engine core (its own scheduler and KV cache: --kv-cache-memory-gb and
--num-kv-blocks are per rank, as in vLLM) on its own CPU set (parallel_config.rank_cpu_sets).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fdcli_engine.api.core_client import CoreClient
from fdcli_engine.parallel_config import num_nodes, rank_cpu_sets
from fdcli_engine.resolved_config import ResolvedConfig


@dataclass
class CoreRank:
    index: int
    client: CoreClient
    ready: bool = False
    dead_reason: str | None = None
    req_ids: set[str] = field(default_factory=set)  # requests sent here and not finished
    call_ids: set[int] = field(default_factory=set)  # utility calls waiting for a reply from here
    last_stats: dict = field(default_factory=dict)  # a dead rank's counters stay in the sums

    @property
    def live(self) -> bool:
        return self.dead_reason is None


def rank_configs(config: ResolvedConfig) -> list[ResolvedConfig]:
    """Each rank's config: its rank number and CPU set, one OpenMP thread per CPU. One rank keeps the
    config as resolved (its threads placed as threads.py decides, as before data parallelism). With
    tensor parallelism each engine's CPUs are its TP ranks' sets (`tp_rank_cpus`), its core (TP rank 0)
    running on the first."""
    n = config.data_parallel_size
    tp = config.tensor_parallel_size
    if tp > 1:
        local = tp // num_nodes(config)  # this node's TP ranks of each engine
        sets = rank_cpu_sets(n * local)
        return [
            config.replace(
                data_parallel_rank=r,
                cpus=sets[r * local],
                num_threads=len(sets[r * local]),
                threads=len(sets[r * local]),
                tp_rank_cpus=sets[r * local : (r + 1) * local],
            )
            for r in range(n)
        ]
    if n <= 1:
        return [config]
    return [
        config.replace(data_parallel_rank=r, cpus=cpus, num_threads=len(cpus), threads=len(cpus))
        for r, cpus in enumerate(rank_cpu_sets(n))
    ]
