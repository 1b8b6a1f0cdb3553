"""The engine-core process: builds an EngineCore and steps it continuously.

Run as `python -m fdcli_engine.api.core_proc --input ADDR --output ADDR --config JSON [--core MOD:ATTR]`.
Loop invariant: while the core has unfinished requests it never blocks on the input socket (it drains
whatever arrived, then steps); when idle it blocks on the input socket, so an idle server costs no CPU.
Every message is msgpack (core_messages); nothing is pickled.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import time
import traceback

import zmq

from fdcli_engine.api.core_messages import (
    AbortRequest,
    AddRequest,
    FatalMsg,
    Heartbeat,
    OutputsMsg,
    ReadyMsg,
    RequestFailed,
    Shutdown,
    UtilityReply,
    UtilityRequest,
    event_encoder,
    input_decoder,
)
from fdcli_engine.log_files import CORE_LOG, configure_logging
from fdcli_engine.threads import place_io_threads, set_engine_process_env

logger = logging.getLogger("fd.core")
DEFAULT_CORE = "fdcli_engine.engine:EngineCore"
IDLE_POLL_MS = 1000
HEARTBEAT_S = 1.0  # while busy, the longest the core stays silent between steps


def load_core_class(spec: str):
    """`module:Class` → the core class (a stub core's in the front-end benchmark and tests)."""
    module_name, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module_name), attr or "EngineCore")


def build_core(config_json: str, core_spec: str):
    from fdcli_engine.resolved_config import ResolvedConfig

    config = ResolvedConfig.from_json(config_json)  # resolved by the front end: not resolved again
    # Before the core imports paddle. This process is fd's: its OpenMP threads are bound by default.
    set_engine_process_env(config.num_threads, config.cpus, bind=True)
    return load_core_class(core_spec)(config), config


class CoreLoop:
    """Owns the sockets and the core; `run()` returns when told to shut down."""

    def __init__(self, core, input_sock: zmq.Socket, output_sock: zmq.Socket):
        self.core = core
        self.input = input_sock
        self.output = output_sock
        self.poller = zmq.Poller()
        self.poller.register(input_sock, zmq.POLLIN)
        self.running = True
        self.parent_pid = os.getppid()
        self.last_sent = time.monotonic()

    def send(self, msg) -> None:
        self.output.send(event_encoder.encode(msg), copy=False)
        self.last_sent = time.monotonic()

    def handle(self, msg) -> None:
        if isinstance(msg, AddRequest):
            self.add(msg)
        elif isinstance(msg, AbortRequest):
            outs = self.core.abort_requests(msg.req_ids)
            if outs:
                self.send(OutputsMsg(outs))
        elif isinstance(msg, UtilityRequest):
            self.utility(msg)
        elif isinstance(msg, Shutdown):
            self.running = False

    def add(self, msg: AddRequest) -> None:
        try:
            self.core.add_request(msg)  # the message is the core's EngineCoreRequest
        except Exception as e:  # a bad request fails alone; the loop goes on
            from fdcli_engine.errors import InvalidRequestError

            status = 400 if isinstance(e, InvalidRequestError) else 500
            if status == 500:
                logger.error("add_request(%s) failed:\n%s", msg.req_id, traceback.format_exc())
            self.send(RequestFailed(msg.req_id, str(e), status, getattr(e, "param", None)))

    def utility(self, msg: UtilityRequest) -> None:
        try:
            if msg.method != "get_stats":
                raise ValueError(f"unknown utility method {msg.method!r}")
            self.send(UtilityReply(msg.call_id, result=self.core.get_stats()))
        except Exception as e:
            self.send(UtilityReply(msg.call_id, error=str(e)))

    def drain_input(self, timeout_ms: int) -> None:
        events = dict(self.poller.poll(timeout_ms))
        while self.input in events:
            try:
                frame = self.input.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            try:
                msg = input_decoder.decode(frame.buffer)
            except Exception as e:  # malformed frame from a buggy front end: log, never die
                logger.error("dropping undecodable message: %s", e)
                continue
            self.handle(msg)

    def step_once(self) -> None:
        try:
            outs = self.core.step()
        except Exception:
            # A fault inside step() cannot be pinned on one request; fail the running ones and go on.
            logger.error("engine step failed:\n%s", traceback.format_exc())
            outs = self.abort_all()
        if outs:
            self.send(OutputsMsg(list(outs)))
        elif time.monotonic() - self.last_sent >= HEARTBEAT_S:
            self.send(Heartbeat())  # steps without outputs (long prompts in chunks) are progress too

    def abort_all(self) -> list:
        ids = list(getattr(getattr(self.core, "scheduler", None), "requests", None) or [])
        try:
            return self.core.abort_requests(ids) if ids else []
        except Exception:
            logger.error("abort after a failed step also failed:\n%s", traceback.format_exc())
            return []

    def run(self) -> None:
        while self.running:
            busy = self.core.has_unfinished_requests()
            if os.getppid() != self.parent_pid:  # reparented: the front end died without telling us
                logger.error("front end is gone; engine core exits")
                return
            self.drain_input(0 if busy else IDLE_POLL_MS)
            if self.running and self.core.has_unfinished_requests():
                self.step_once()


def _ignore_group_signals() -> None:
    """Ctrl-C in a terminal, `timeout`, and systemd's control-group stop signal every process of the
    server at once. The front end owns shutdown (it drains, sends Shutdown, and kills this process if
    it does not leave), so the core ignores SIGINT/SIGTERM rather than dying mid-drain, and so Paddle's
    own SIGTERM handler does not print a C++ "FatalError" report. A front end that is gone is noticed by
    the reparenting check in the loop."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


def fail_fast_on_rank_death(core, output_addr: str) -> None:
    """Tensor parallel: a worker that dies may leave this process inside a collective, so the watchdog
    thread reports it to the front end itself (a socket of its own: zmq sockets are not thread-safe)
    and the process exits; the front end fails the requests with the reason and reports the engine
    dead, and the other workers die with this process."""
    workers = getattr(core, "tp_workers", None)
    if workers is None:
        return

    def on_dead(reason: str) -> None:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 2000)
        sock.connect(output_addr)
        sock.send(event_encoder.encode(FatalMsg(reason)))
        sock.close()
        ctx.term()
        os._exit(1)

    workers.on_dead = on_dead
    if workers.dead_reason is not None:  # died while the model loaded
        on_dead(workers.dead_reason)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fd-engine-core")
    p.add_argument("--input", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--config", required=True, help="ResolvedConfig fields as JSON")
    p.add_argument(
        "--core", default=DEFAULT_CORE, help="module:Class building the core from a ResolvedConfig"
    )
    args = p.parse_args(argv)
    _ignore_group_signals()
    # Importing paddle (in build_core) installs paddle's SIGTERM handler, which would print a C++
    # FatalError report and kill the core mid-load; until the signals are ignored again below they
    # are held (blocked), and a held one is then dropped.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    configure_logging("%(asctime)s fd-core %(levelname)s %(message)s", CORE_LOG)  # + FD_LOG_DIR/workerlog.0

    ctx = zmq.Context()
    out = ctx.socket(zmq.PUSH)
    out.setsockopt(zmq.LINGER, 2000)
    # A front end that stops reading must not wedge the core forever: a send blocked this long fails.
    out.setsockopt(zmq.SNDTIMEO, 30_000)
    out.connect(args.output)
    inp = ctx.socket(zmq.PULL)
    inp.connect(args.input)
    try:
        core, config = build_core(args.config, args.core)
    except Exception as e:
        out.send(event_encoder.encode(FatalMsg(f"{type(e).__name__}: {e}")))
        inp.close(0)  # ctx.term() waits for every socket: an open one would hang the exit
        out.close()
        ctx.term()
        return 1
    _ignore_group_signals()  # again: importing paddle installed its own handlers
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    fail_fast_on_rank_death(core, args.output)
    # The sockets' I/O thread started before the core bound its OpenMP threads: off thread 0's CPU now.
    place_io_threads(getattr(core, "config", config).num_threads)
    vocab = int(getattr(core, "vocab_size", 0) or config.hf_config.get("vocab_size") or 0)
    out.send(event_encoder.encode(ReadyMsg(max_model_len=int(config.max_model_len or 0), vocab_size=vocab)))
    try:
        CoreLoop(core, inp, out).run()
    except zmq.Again:
        logger.error("the front end stopped reading outputs for 30 s; engine core exits")
        out.setsockopt(zmq.LINGER, 0)
    if hasattr(core, "shutdown"):
        core.shutdown()
    inp.close(0)
    out.close()
    ctx.term()
    return 0


if __name__ == "__main__":
    sys.exit(main())
