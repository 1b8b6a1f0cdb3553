"""A worker node: `fd serve --nnodes N --node-rank R` with R > 0 runs only this node's tensor-parallel
ranks (node-major: R*T/N .. (R+1)*T/N - 1), no front end and no engine core.

Each rank is a `runner/tp_worker.py` process, as rank 0 starts its local ones, but reading rank 0's
steps over TCP (runner/tp_remote.py) instead of IPC. This process only starts them and waits: it
exits when they do (rank 0 stopped them, went away, or one failed), or on SIGTERM/SIGINT, which take
the workers with it (they die with their parent, PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

from fdcli_engine.parallel_config import node_ranks, num_nodes, tp_cpu_sets
from fdcli_engine.resolved_config import ResolvedConfig
from fdcli_engine.runner.tp_remote import step_address

logger = logging.getLogger("fd.tp")
WORKER_MODULE = "fdcli_engine.runner.tp_worker"
POLL_S = 0.2


def _start(config: ResolvedConfig) -> list[subprocess.Popen]:
    sets = tp_cpu_sets(config)
    procs = []
    for cpus, rank in zip(sets, node_ranks(config), strict=True):
        wcfg = config.replace(
            tensor_parallel_rank=rank, cpus=cpus, num_threads=len(cpus), threads=len(cpus), tp_rank_cpus=sets
        )
        cmd = [sys.executable, "-m", WORKER_MODULE, "--input", step_address(config)]
        cmd += ["--config", wcfg.to_json(), "--parent", str(os.getpid())]
        procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL))
    return procs


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()  # workers ignore SIGTERM (rank 0 owns a step's end); nothing here is left to drain
    for p in procs:
        p.wait()


def run_worker_node(config: ResolvedConfig) -> int:
    """Run this node's ranks until they end: 0 when every one ended cleanly, else 1."""
    stopping = []

    def on_signal(sig, frame) -> None:
        stopping.append(sig)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    ranks = node_ranks(config)
    address = f"{config.master_addr}:{config.master_port}"
    procs = _start(config)
    logger.info(
        "node %d of %d serving tensor-parallel ranks %s for %s",
        config.node_rank,
        num_nodes(config),
        ranks,
        address,
    )
    try:
        while not stopping and all(p.poll() is None for p in procs):
            time.sleep(POLL_S)
    finally:
        if stopping:
            logger.info("node %d: stopping its ranks (signal %d)", config.node_rank, stopping[0])
        _stop(procs)
    if stopping:
        return 0
    failed = [r for r, p in zip(ranks, procs, strict=True) if p.returncode != 0]
    if failed:
        logger.error(
            "node %d: tensor-parallel rank(s) %s ended with an error or lost rank 0", config.node_rank, failed
        )
        return 1
    logger.info("node %d: rank 0 stopped its ranks", config.node_rank)
    return 0
