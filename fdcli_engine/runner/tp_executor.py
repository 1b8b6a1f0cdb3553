"""Tensor-parallel rank 0's side of its workers (vLLM's executor / worker split).

The engine core is rank 0: it keeps the scheduler, the KV block manager and the sampler, and starts
ranks 1..T-1 (`runner/tp_worker.py`), one process each on its own CPU set, which hold their shard of the
model and of the KV cache and run only the model forward. `TPModel` wraps rank 0's shard: before each
forward and each LM-head call it sends the workers the same inputs (tp_messages), so every rank runs the
same collectives in the same order; only rank 0's results leave the runner.

A worker that dies cannot be waited for: rank 0 may be inside a collective with it. A watchdog thread
sees the exit at once (a process descriptor) and calls `on_dead(reason)`; the engine-core process
reports it to the front end and exits (engine dead, its requests failed with the reason), the in-process
engine marks itself dead and every later forward raises the reason. Workers die with rank 0
(PR_SET_PDEATHSIG), so none outlives it.
"""

from __future__ import annotations

import logging
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

import numpy as np
import zmq

from fdcli_engine.distributed import CollectiveError, ProcessGroup
from fdcli_engine.errors import ConfigError
from fdcli_engine.parallel_config import node_ranks, tp_cpu_sets
from fdcli_engine.resolved_config import ResolvedConfig
from fdcli_engine.runner import tp_messages as m
from fdcli_engine.runner.tp_remote import RemoteRanks, TensorParallelError, group_timeout

logger = logging.getLogger("fd.tp")
WORKER_MODULE = "fdcli_engine.runner.tp_worker"


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class TPWorkers:
    """Ranks 1..T-1 of one engine: started at construction; `send` reaches all of them."""

    def __init__(self, config: ResolvedConfig, on_dead: Callable[[str], None] | None = None):
        if config.node_rank != 0:  # node R > 0 runs runner/tp_node.py, never an engine core
            raise ConfigError(f"--node-rank {config.node_rank}: only node 0 runs the engine core")
        self.world_size = config.tensor_parallel_size
        self.local_ranks = len(node_ranks(config))  # this node's: ranks 0..local-1
        sets = config.tp_rank_cpus or tp_cpu_sets(config)
        host = config.master_addr or "127.0.0.1"
        # --master-port as given (one group per data-parallel rank: the next ports), else a free one.
        port = config.master_port + config.data_parallel_rank if config.master_port else _free_port(host)
        self.config = config.replace(
            master_addr=host, master_port=port, tp_rank_cpus=sets, cpus=config.cpus or sets[0]
        )
        self.on_dead = on_dead
        self.dead_reason: str | None = None
        self._lock = threading.Lock()
        self._closing = False
        self._ctx = zmq.Context()
        self._remote = None  # ranks on other nodes (runner/tp_remote.py)
        if self.local_ranks < self.world_size:
            try:
                self._remote = RemoteRanks(self._ctx, self.config, self.local_ranks)
            except BaseException:
                self._ctx.term()
                raise
        self._tmpdir = tempfile.mkdtemp(prefix="fd-tp-")
        self._socks: list[zmq.Socket] = []
        self.procs: list[subprocess.Popen] = []
        for r in range(1, self.local_ranks):
            addr = f"ipc://{self._tmpdir}/rank{r}"
            sock = self._ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.setsockopt(zmq.LINGER, 0)
            sock.bind(addr)
            self._socks.append(sock)
            cpus = sets[r]
            wcfg = self.config.replace(
                tensor_parallel_rank=r, cpus=cpus, num_threads=len(cpus), threads=len(cpus)
            )
            cmd = [sys.executable, "-m", WORKER_MODULE, "--input", addr]
            cmd += ["--config", wcfg.to_json(), "--parent", str(os.getpid())]
            self.procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL))
        self._watcher = threading.Thread(target=self._watch, name="fd-tp-watch", daemon=True)
        self._watcher.start()
        logger.info(
            "tensor parallel: %d ranks (%d on this node), CPUs %s, rendezvous %s:%d",
            self.world_size,
            self.local_ranks,
            sets,
            host,
            port,
        )

    def init_group(self) -> ProcessGroup:
        """Rank 0's membership of the group, once every worker joined. The join runs on a thread so
        that a worker dying first (a broken environment, a bad CPU set) fails the start at once
        rather than after the group's timeout; the abandoned join ends at that timeout."""
        from fdcli_engine.distributed.init import init_tp_group  # noqa: PLC0415
        from fdcli_engine.threads import import_paddle  # noqa: PLC0415

        # Paddle's eager mode is per thread, set up in the thread that imports it: this one, not the join's.
        import_paddle()
        c = self.config
        result: dict = {}

        def join() -> None:
            try:
                result["group"] = init_tp_group(
                    0, self.world_size, c.master_addr, c.master_port, self.local_ranks, group_timeout()
                )
                if self._remote is not None:
                    self._remote.await_hellos(group_timeout())
            except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
                result["error"] = exc

        t = threading.Thread(target=join, name="fd-tp-join", daemon=True)
        t.start()
        while t.is_alive():
            t.join(0.05)
            if t.is_alive() and self.dead_reason is not None:
                raise TensorParallelError(f"{self.dead_reason} before joining the group")
        if "error" in result:
            raise result["error"]
        return result["group"]

    def _watch(self) -> None:
        """Until close(): wake when a worker exits (its process descriptor turns readable; a poll every
        quarter second where the OS has none) and report the first death."""
        fds = []
        for p in self.procs:
            try:
                fds.append(os.pidfd_open(p.pid))
            except (AttributeError, OSError):
                pass
        try:
            while not self._closing:
                select.select(fds, [], [], 0.25)
                for r, p in enumerate(self.procs, start=1):
                    code = p.poll()
                    if code is not None and not self._closing:
                        self._died(r, p, code)
                        return
        finally:
            for fd in fds:
                os.close(fd)

    def _died(self, rank: int, proc: subprocess.Popen, code: int) -> None:
        with self._lock:  # the watchdog and a failed collective may both find the death
            if self.dead_reason is not None:
                return
            how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        self._fatal(f"tensor-parallel rank {rank} (pid {proc.pid}) {how}")

    def _fatal(self, reason: str) -> None:
        with self._lock:
            if self.dead_reason is not None:
                return
            self.dead_reason = reason
        logger.error("%s: the engine cannot go on", self.dead_reason)
        if self.on_dead is not None:
            self.on_dead(self.dead_reason)

    def blame(self, exc: BaseException, wait_s: float = 2.0) -> None:
        """A collective failed with `exc`: if a worker died (now, or within `wait_s`, the time its exit
        takes to show), that death is the engine's and TensorParallelError says so; else return."""
        deadline = time.monotonic() + wait_s
        while True:
            for r, p in enumerate(self.procs, start=1):
                code = p.poll()
                if code is not None:
                    self._died(r, p, code)
                    raise TensorParallelError(self.dead_reason) from exc
            if self.dead_reason is not None:
                raise TensorParallelError(self.dead_reason) from exc
            if time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        if self._remote is not None and isinstance(exc, CollectiveError):
            # No local rank died: a remote one did, or its node's link broke. The group is unusable.
            self._fatal(f"{exc} (a rank on another node died or its link broke)")
            raise TensorParallelError(self.dead_reason) from exc

    def send(self, msg) -> None:
        if self.dead_reason is not None:
            raise TensorParallelError(self.dead_reason)
        frame = m.encoder.encode(msg)
        for sock in self._socks:
            sock.send(frame, copy=False)
        if self._remote is not None:
            try:
                self._remote.send(frame)
            except TensorParallelError as exc:
                self._fatal(str(exc))
                raise

    def close(self, timeout: float = 5.0) -> None:
        if self._closing:
            return
        self._closing = True
        try:
            frame = m.encoder.encode(m.StopWorker())
            for sock in self._socks:
                sock.send(frame, zmq.NOBLOCK)
            if self._remote is not None:
                self._remote.send(frame, zmq.NOBLOCK)
        except (zmq.ZMQError, TensorParallelError):
            pass
        for p in self.procs:
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for sock in self._socks:
            sock.close(0)
        if self._remote is not None:
            self._remote.close()
        self._ctx.term()
        shutil.rmtree(self._tmpdir, ignore_errors=True)


def _forward_msg(input_ids, positions, meta) -> m.ForwardStep:
    rows = meta.prompt_rows
    return m.ForwardStep(
        input_ids=m.NDArray.of(input_ids.numpy()),
        positions=m.NDArray.of(positions.numpy()),
        slot_mapping=m.NDArray.of(meta.slot_mapping.numpy()),
        query_start_loc=m.NDArray.of(meta.query_start_loc_np),
        seq_lens=m.NDArray.of(meta.seq_lens_np),
        block_tables=m.NDArray.of(meta.block_tables.numpy()),
        prompt_rows=m.NDArray.of(rows.numpy()) if rows is not None else None,
        max_query_len=int(meta.max_query_len),
        max_seq_len=int(meta.max_seq_len),
        block_size=int(meta.block_size),
    )


class TPModel:
    """Rank 0's model shard, seen by the runner as the model: forward and compute_logits first send
    the workers the same call. Every other attribute is the shard's."""

    # The shard's one-op greedy step (models/decoder.forward_greedy) would run its layers without
    # sending the workers the forward their all-reduces wait for: the runner takes `forward` instead.
    forward_greedy = None

    def __init__(self, model, workers: TPWorkers):
        self._model = model
        self._workers = workers

    def __getattr__(self, name):
        return getattr(self._model, name)

    def start(self, num_blocks: int) -> None:
        self._workers.send(m.WorkerInit(num_blocks))

    def forward(self, input_ids, positions, kv_caches, meta):
        self._workers.send(_forward_msg(input_ids, positions, meta))
        try:
            return self._model.forward(input_ids, positions, kv_caches, meta)
        except Exception as exc:
            self._workers.blame(exc)
            raise

    def compute_logits(self, hidden):
        self._workers.send(m.LogitsStep(m.NDArray.of(np.asarray(hidden.numpy(), dtype=np.float32))))
        try:
            return self._model.compute_logits(hidden)
        except Exception as exc:
            self._workers.blame(exc)
            raise
