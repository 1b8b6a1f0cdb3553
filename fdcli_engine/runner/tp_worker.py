"""A tensor-parallel worker: ranks 1..T-1 of one engine (runner/tp_executor.py starts them).

Run as `python -m fdcli_engine.runner.tp_worker --input ADDR --config JSON --parent PID`. It joins the
group, loads its shard of the model, allocates its shard of the KV cache (WorkerInit) and then runs what
rank 0 sends, in order: each ForwardStep's forward, each LogitsStep's LM head. It never samples and
answers nothing: the collectives are the lockstep. It exits on StopWorker, when rank 0 is gone
(PR_SET_PDEATHSIG, and the reparenting check), or on an error (rank 0's watchdog then sees it exit).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import os
import signal
import sys
import traceback

import zmq

from fdcli_engine.log_files import configure_logging
from fdcli_engine.resolved_config import ResolvedConfig
from fdcli_engine.runner import tp_messages as m
from fdcli_engine.runner.tp_remote import connect_to_rank0
from fdcli_engine.threads import set_engine_process_env

logger = logging.getLogger("fd.tp")
POLL_MS = 1000
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _ignore_signals() -> None:
    """Rank 0 owns shutdown: a terminal's Ctrl-C or a group SIGTERM must not kill a worker mid-step."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


def _pin(config: ResolvedConfig) -> None:
    """This rank's CPUs and OpenMP settings, before paddle starts a thread, as rank 0's core process sets
    its own. No default binding: tp_executor and tp_node give every rank its CPU set, which binds it."""
    set_engine_process_env(config.num_threads, config.cpus, bind=False)


def _inputs(step: m.ForwardStep):
    import paddle  # noqa: PLC0415

    from fdcli_engine.step_types import AttentionMetadata  # noqa: PLC0415

    cpu = paddle.CPUPlace()

    def t(a: m.NDArray):
        return paddle.Tensor(a.array().copy(), cpu)

    meta = AttentionMetadata(
        slot_mapping=t(step.slot_mapping),
        query_start_loc=t(step.query_start_loc),
        seq_lens=t(step.seq_lens),
        block_tables=t(step.block_tables),
        max_query_len=step.max_query_len,
        max_seq_len=step.max_seq_len,
        block_size=step.block_size,
        query_start_loc_np=step.query_start_loc.array().copy(),
        seq_lens_np=step.seq_lens.array().copy(),
        prompt_rows=t(step.prompt_rows) if step.prompt_rows is not None else None,
    )
    return t(step.input_ids), t(step.positions), meta


class Worker:
    def __init__(self, config: ResolvedConfig):
        from fdcli_engine import ops  # noqa: PLC0415
        from fdcli_engine.distributed import set_tp_group  # noqa: PLC0415
        from fdcli_engine.distributed.init import init_tp_group  # noqa: PLC0415
        from fdcli_engine.loader import load_model  # noqa: PLC0415
        from fdcli_engine.parallel_config import node_ranks  # noqa: PLC0415
        from fdcli_engine.runner.tp_remote import group_timeout  # noqa: PLC0415
        from fdcli_engine.threads import set_num_threads  # noqa: PLC0415

        set_num_threads(config.num_threads)
        self.config = config
        rank, ws = config.tensor_parallel_rank, config.tensor_parallel_size
        local = len(node_ranks(config))
        group = init_tp_group(rank, ws, config.master_addr, config.master_port, local, group_timeout())
        set_tp_group(group)
        self.model = load_model(config)
        ops.bind_engine_threads(config.num_threads)
        self.kv_caches = None

    def handle(self, msg) -> bool:
        """Run one message; False once told to stop."""
        import paddle  # noqa: PLC0415

        from fdcli_engine.runner.kv_cache import allocate_kv_caches  # noqa: PLC0415

        if isinstance(msg, m.ForwardStep):
            input_ids, positions, meta = _inputs(msg)
            self.model.forward(input_ids, positions, self.kv_caches, meta)
        elif isinstance(msg, m.LogitsStep):
            self.model.compute_logits(paddle.Tensor(msg.hidden.array().copy(), paddle.CPUPlace()))
        elif isinstance(msg, m.WorkerInit):
            c = self.config
            self.kv_caches = allocate_kv_caches(self.model, msg.num_blocks, c.block_size, c.kv_cache_dtype)
            logger.info(
                "tensor-parallel rank %d of %d ready: %d KV head(s), %d KV blocks, CPUs %s",
                c.tensor_parallel_rank,
                c.tensor_parallel_size,
                self.model.num_kv_heads,
                msg.num_blocks,
                c.cpus,
            )
        elif isinstance(msg, m.StopWorker):
            return False
        return True


def serve(worker: Worker, sock: zmq.Socket, parent: int, monitor: zmq.Socket | None = None) -> bool:
    """Run rank 0's messages until told to stop (True) or until rank 0 is gone (False)."""
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    if monitor is not None:  # a rank on another node: rank 0's connection dropping ends it
        poller.register(monitor, zmq.POLLIN)
    while True:
        ready = dict(poller.poll(POLL_MS))
        if sock in ready:
            if not worker.handle(m.decoder.decode(sock.recv(copy=False).buffer)):
                return True
            continue
        if monitor is not None and monitor in ready:
            logger.error("tensor-parallel rank 0 closed its connection; worker exits")
            return False
        if os.getppid() != parent:
            logger.error("tensor-parallel rank 0 is gone; worker exits")
            return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fd-tp-worker")
    p.add_argument("--input", required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--parent", type=int, required=True)
    args = p.parse_args(argv)
    _die_with_parent()
    _ignore_signals()
    if os.getppid() != args.parent:
        return 1  # rank 0 died before the death signal was armed
    config = ResolvedConfig.from_json(args.config)
    _pin(config)
    rank = config.tensor_parallel_rank
    # FastDeploy's per-device worker log: workerlog.<rank> under FD_LOG_DIR (rank 0's is the core's).
    configure_logging(f"%(asctime)s fd-tp{rank} %(levelname)s %(message)s", f"workerlog.{rank}")
    ctx = zmq.Context()
    monitor = None
    if args.input.startswith("tcp://"):  # a rank on another node than rank 0's (runner/tp_remote.py)
        sock, monitor = connect_to_rank0(ctx, args.input, rank)
    else:
        sock = ctx.socket(zmq.PULL)
        sock.connect(args.input)
    try:
        worker = Worker(config)
        _ignore_signals()  # again: importing paddle installed its own SIGTERM handler
        if not serve(worker, sock, args.parent, monitor):
            return 1
    except Exception:
        logger.error(
            "tensor-parallel rank %d failed:\n%s", config.tensor_parallel_rank, traceback.format_exc()
        )
        return 1
    finally:
        if monitor is not None:
            sock.disable_monitor()
            monitor.close(0)
        sock.close(0)
        ctx.term()
    return 0


if __name__ == "__main__":
    sys.exit(main())
