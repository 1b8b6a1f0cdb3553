"""Parallel engines: what the data-, tensor- and expert-parallel options mean, and their checks.

Topology (FastDeploy's and vLLM's names):
- `--data-parallel-size D`: D engine cores under one front end, each with its own KV cache, scheduler and
  CPU set; a request runs on exactly one of them.
- `--tensor-parallel-size T`: each engine core's model is split over T ranks (processes) that step
  together and all-reduce inside the forward; `--enable-expert-parallel` shards MoE experts over them.
- `--nnodes N` / `--node-rank R` (vLLM) or `--ips h1,h2` (FastDeploy: this node is the one whose address
  it lists): the T x D ranks spread over N machines, `--master-addr:--master-port` the rendezvous.
- `--distributed-executor-backend ray` (`fd run-batch` only; `--ray-address`, default a local instance):
  the batch's lines go to Ray actors, one engine each.

Leaf module: `EngineConfig.validate` calls `check_parallel_options` (pure, before paddle loads). CPU
placement of the ranks is `rank_cpu_sets`.
"""

from __future__ import annotations

import glob
import os
from typing import Any

from fdcli_engine.errors import ConfigError, need
from fdcli_engine.threads import BIND_ENV, RANK_SEPARATOR, allowed_cpus, parse_cpu_list, usable_cpu_count

# vLLM's uni (the model runs in the engine core's process) is what fd's mp does with one rank.
EXECUTOR_BACKENDS = ("mp", "uni", "ray")


def node_ips(config: Any) -> list[str]:
    """FastDeploy's --ips as a list (empty when not given)."""
    return [ip.strip() for ip in (config.ips or "").split(",") if ip.strip()]


def num_nodes(config: Any) -> int:
    return len(node_ips(config)) or config.nnodes


def local_addresses() -> set[str]:
    """This host's IPv4 addresses (loopback included), to find it in --ips."""
    import socket  # noqa: PLC0415

    found = {"127.0.0.1"}
    try:
        import psutil  # noqa: PLC0415

        for addrs in psutil.net_if_addrs().values():
            found.update(a.address for a in addrs if a.family == socket.AF_INET)
    except Exception:  # noqa: BLE001 - no psutil or no interface list: the host name's addresses only
        pass
    try:
        found.update(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    return found


def resolve_nodes(config: Any) -> dict:
    """--nnodes/--node-rank/--master-addr as the engine uses them, from --ips where given (FastDeploy:
    one address per node, the first is the master, this node is the first that is one of this host's
    addresses unless --node-rank names another). Checks what several nodes need. {} for one node."""
    ips = node_ips(config)
    nodes = len(ips) or config.nnodes
    if nodes <= 1:
        return {}
    rank, master = config.node_rank, config.master_addr
    if ips:
        master = master or ips[0]
        if not rank:
            mine = local_addresses()
            matches = [i for i, ip in enumerate(ips) if ip in mine]
            need(
                bool(matches),
                f"--ips {','.join(ips)}: none is an address of this host ({', '.join(sorted(mine))}); "
                "give --node-rank",
            )
            rank = matches[0]
    need(
        config.data_parallel_size == 1,
        f"--nnodes {nodes} with --data-parallel-size {config.data_parallel_size} is not built yet: "
        "several nodes run one tensor-parallel engine",
    )
    tp = config.tensor_parallel_size
    need(
        tp % nodes == 0 and tp >= nodes,
        f"--tensor-parallel-size {tp} does not divide over {nodes} nodes (each node runs the same number "
        "of ranks)",
    )
    need(
        config.master_port is not None,
        f"--nnodes {nodes} needs --master-port (the same on every node; it and the next port are used)",
    )
    need(config.master_port < 65535, f"--master-port {config.master_port}: the next port is used too")
    return {"nnodes": nodes, "node_rank": rank, "master_addr": master or "127.0.0.1"}


def node_ranks(config: Any) -> list[int]:
    """The tensor-parallel ranks this node runs, node-major: node r holds r*T/N .. (r+1)*T/N - 1."""
    local = config.tensor_parallel_size // num_nodes(config)
    return list(range(config.node_rank * local, (config.node_rank + 1) * local))


def ranks_per_node(config: Any) -> int:
    """Engine processes this node runs: every TP rank of every DP rank, divided over the nodes."""
    return max(1, config.tensor_parallel_size * config.data_parallel_size // num_nodes(config))


def check_parallel_options(config: Any) -> None:
    tp, dp = config.tensor_parallel_size, config.data_parallel_size
    need(tp >= 1, f"--tensor-parallel-size must be at least 1, got {tp}")
    need(dp >= 1, f"--data-parallel-size must be at least 1, got {dp}")
    need(config.nnodes >= 1, f"--nnodes must be at least 1, got {config.nnodes}")
    ips = node_ips(config)
    need(
        not ips or config.nnodes in (1, len(ips)),
        f"--ips lists {len(ips)} node(s) but --nnodes is {config.nnodes}: give one of them",
    )
    nodes = num_nodes(config)
    need(
        0 <= config.node_rank < nodes,
        f"--node-rank {config.node_rank}: use 0 to {nodes - 1} (--nnodes {nodes})",
    )
    need(
        (tp * dp) % nodes == 0,
        f"{tp * dp} rank(s) (--tensor-parallel-size {tp} x --data-parallel-size {dp}) do not divide "
        f"over {nodes} nodes",
    )
    port = config.master_port
    need(port is None or 1 <= port <= 65535, f"--master-port must be 1-65535, got {port}")
    backend = config.distributed_executor_backend
    need(
        backend != "uni" or tp == 1,
        f"--distributed-executor-backend uni runs one process: it needs --tensor-parallel-size 1, got {tp} "
        "(use mp)",
    )
    need(
        backend != "external_launcher",
        "--distributed-executor-backend external_launcher is not supported: fd starts its own ranks (one "
        "process per --tensor-parallel-size rank, --nnodes for several machines); use mp",
    )
    need(
        backend in EXECUTOR_BACKENDS,
        f"--distributed-executor-backend {backend!r}: use mp, uni or ray",
    )
    if backend == "ray":
        return  # Ray places the engines over the cluster's CPUs (checked against it when it is joined)
    cpus = usable_cpu_count()
    local = ranks_per_node(config)
    need(
        local <= cpus,
        f"{local} engine rank(s) on this node (--tensor-parallel-size {tp} x --data-parallel-size {dp}"
        f"{f' / {nodes} nodes' if nodes > 1 else ''}) but only {cpus} CPU(s) to run them: each rank needs "
        "at least one",
    )


def _numa_nodes(allowed: list[int]) -> list[list[int]]:
    """The allowed CPUs grouped by NUMA node (one group where the OS shows no nodes)."""
    groups = []
    for path in sorted(glob.glob("/sys/devices/system/node/node[0-9]*/cpulist")):
        try:
            with open(path) as f:
                cpus = [c for c in parse_cpu_list(f.read().strip()) if c in allowed]
        except (OSError, ValueError):
            continue
        if cpus:
            groups.append(cpus)
    return groups or [list(allowed)]


def rank_cpu_sets(
    num_ranks: int, allowed: list[int] | None = None, bind: str | None = None
) -> list[list[int]]:
    """The CPUs of each of this node's `num_ranks` engine processes.

    FD_CPU_OMP_THREADS_BIND with one list per rank ("0-31|32-63") is taken as given (each list within the
    allowed CPUs); otherwise the allowed CPUs are split evenly, NUMA node by NUMA node where there are
    several, so that no rank spans two nodes when the ranks divide the nodes. ConfigError when there are
    fewer CPUs than ranks or the lists do not match the ranks.
    """
    allowed = sorted(allowed if allowed is not None else (allowed_cpus() or range(os.cpu_count() or 1)))
    bind = os.environ.get(BIND_ENV) if bind is None else bind
    if bind and RANK_SEPARATOR in bind:
        try:
            sets = [parse_cpu_list(part) for part in bind.split(RANK_SEPARATOR)]
        except ValueError:
            raise ConfigError(f"{BIND_ENV}={bind!r}: use one CPU list per rank, such as 0-31|32-63") from None
        need(
            len(sets) == num_ranks,
            f"{BIND_ENV}={bind!r} gives {len(sets)} CPU list(s) for {num_ranks} engine rank(s)",
        )
        for cpus in sets:
            need(set(cpus) <= set(allowed), f"{BIND_ENV}={bind!r}: this process may only use CPUs {allowed}")
        return sets
    need(len(allowed) >= num_ranks, f"{num_ranks} engine rank(s) but only {len(allowed)} CPU(s)")
    nodes = _numa_nodes(allowed)
    if (
        len(nodes) > 1
        and num_ranks % len(nodes) == 0
        and all(len(n) >= num_ranks // len(nodes) for n in nodes)
    ):
        per = num_ranks // len(nodes)
        return [part for node in nodes for part in _split(node, per)]
    return _split(allowed, num_ranks)


def _split(cpus: list[int], parts: int) -> list[list[int]]:
    """`cpus` in `parts` contiguous runs whose sizes differ by at most one."""
    size, extra = divmod(len(cpus), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(cpus[start:end])
        start = end
    return out


def tp_cpu_sets(config: Any) -> list[list[int]]:
    """The CPUs of each tensor-parallel rank of one engine on this node: its data-parallel rank's set (`cpus`) split
    in tensor_parallel_size runs, or without one every allowed CPU split as rank_cpu_sets does
    (FD_CPU_OMP_THREADS_BIND may give one list per TP rank)."""
    tp = config.tensor_parallel_size // num_nodes(config)  # this node's ranks
    if config.cpus:
        return rank_cpu_sets(tp, allowed=list(config.cpus), bind="")
    return rank_cpu_sets(tp)


def check_tensor_parallel_model(hf_config: dict, config: Any) -> None:
    """What the model must allow for --tensor-parallel-size T (read from its config, before any weight):
    whole KV heads, query heads and intermediate features per rank, whole experts with expert parallel."""
    tp = config.tensor_parallel_size
    if tp == 1:
        return
    heads = int(hf_config.get("num_attention_heads") or 0)
    kv = int(hf_config.get("num_key_value_heads") or heads)
    need(kv % tp == 0, f"{kv} KV heads do not divide by tensor-parallel size {tp}")
    need(heads % tp == 0, f"{heads} attention heads do not divide by tensor-parallel size {tp}")
    sizes = {"intermediate_size": hf_config.get("intermediate_size")}
    experts = hf_config.get("moe_num_experts")
    if experts:
        if config.enable_expert_parallel:
            need(int(experts) % tp == 0, f"{experts} experts do not divide by tensor-parallel size {tp}")
        else:
            sizes["moe_intermediate_size"] = hf_config.get("moe_intermediate_size")
        shared = int(hf_config.get("moe_num_shared_experts") or 0)
        if shared:
            sizes["moe_intermediate_size x moe_num_shared_experts"] = shared * int(
                hf_config.get("moe_intermediate_size") or 0
            )
    for name, size in sizes.items():
        if size:
            need(int(size) % tp == 0, f"{name} {size} does not divide by tensor-parallel size {tp}")
