"""Front-end side of the engine-core process: spawn it, talk to it over ZMQ, watch that it lives.

The front end binds both IPC sockets (so a core that dies and is never restarted leaves nothing behind
but a temp dir that `shutdown()` removes) and the core connects. Sends are non-blocking PUSHes with no
high-water mark, so `send()` is safe to call from sync code on the event loop (e.g. a `finally` that
aborts a cancelled request). Receiving is a reader callback on the output socket's file descriptor that
drains every queued event and hands each to `on_event`: no future or task per message (pyzmq's asyncio
sockets cost the front end CPU per message, one message per engine step: docs/engine-measurements.md).

Watchdog (`--engine-watchdog-timeout`): a core that exits is noticed at once, but a frozen one (stopped,
deadlocked, stuck in one step) sends nothing. While the front end has work in the core, every event
from it counts as progress (a busy core sends at least a Heartbeat per second). After the timeout
without any, the core is killed and reported dead, which fails the waiting requests with 503 and
turns /health and /ready to 503. A check runs every quarter of the timeout and trips after more than
1.25 timeouts of measured silence, so it never trips before a full timeout of real silence (the clock
starts at the last check that found no work) and always by 1.5 timeouts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import zmq

from fdcli_engine.api.core_messages import Shutdown, event_decoder, input_encoder
from fdcli_engine.resolved_config import ResolvedConfig

# Plain ints: with pyzmq's enum constants each readiness check (twice an engine step) builds enum members
# in Python (`int & PollEvent` is a PollEvent), which costs more than the socket call itself.
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)

logger = logging.getLogger("fd.serve")
DEFAULT_CORE = "fdcli_engine.engine:EngineCore"
WATCH_INTERVAL_S = 0.25  # only where the OS has no process descriptors (pidfd)
WATCHDOG_CHECKS = 4  # watchdog checks per timeout


class CoreClient:
    def __init__(
        self,
        config: ResolvedConfig,
        on_event: Callable[[object], None],
        on_dead: Callable[[str], None],
        core_spec: str = DEFAULT_CORE,
        core_stdout: int | None = None,
        busy: Callable[[], bool] | None = None,
    ):
        """`busy()`: whether the front end waits on the core (the watchdog runs only then)."""
        self.config = config
        self.on_event = on_event
        self.on_dead = on_dead
        self.core_spec = core_spec
        # Where the core's stdout goes (a file descriptor); None inherits ours. `fd run-batch -o -`
        # writes results to stdout, so it sends the core's stray prints to stderr instead.
        self.core_stdout = core_stdout
        self.proc: subprocess.Popen | None = None
        self._tmpdir = Path(tempfile.mkdtemp(prefix="fd-ipc-"))
        self._sync_ctx = zmq.Context()
        self._tasks: list[asyncio.Task] = []
        self._reader_fd: int | None = None
        self._pidfd: int | None = None
        self._closing = False
        self.busy = busy
        self.watchdog_timeout = float(config.engine_watchdog_timeout or 0.0)
        self._last_progress = time.monotonic()
        self._watchdog: asyncio.TimerHandle | None = None

    def start(self) -> None:
        in_addr = f"ipc://{self._tmpdir}/input"
        out_addr = f"ipc://{self._tmpdir}/output"
        self._input = self._sync_ctx.socket(zmq.PUSH)
        self._input.setsockopt(zmq.SNDHWM, 0)
        self._input.setsockopt(zmq.LINGER, 0)
        self._input.bind(in_addr)
        self._output = self._sync_ctx.socket(zmq.PULL)
        self._output.setsockopt(zmq.RCVHWM, 0)
        self._output.bind(out_addr)
        cmd = [sys.executable, "-m", "fdcli_engine.api.core_proc", "--input", in_addr, "--output", out_addr]
        cmd += ["--config", self.config.to_json(), "--core", self.core_spec]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self.core_stdout)
        loop = asyncio.get_running_loop()
        self._reader_fd = self._output.getsockopt(zmq.FD)
        loop.add_reader(self._reader_fd, self._drain_output)
        loop.call_soon(self._drain_output)  # anything queued before the reader existed raises no new edge
        self._watch(loop)
        if self.watchdog_timeout > 0 and self.busy is not None:
            self._watchdog = loop.call_later(self.watchdog_timeout / WATCHDOG_CHECKS, self._check_progress)

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Notice the core's exit. A process descriptor (Linux 5.3+) turns readable the moment the core
        exits: no delay and no periodic wake-up of the front end, each of which takes CPU from the
        engine on a machine whose cores it shares. Elsewhere, poll every WATCH_INTERVAL_S."""
        try:
            self._pidfd = os.pidfd_open(self.proc.pid)
        except (AttributeError, OSError):  # no os.pidfd_open (not Linux), or a kernel without it
            self._tasks = [loop.create_task(self._watch_loop())]
            return
        loop.add_reader(self._pidfd, self._check_exit)

    def _check_exit(self) -> bool:
        """True once the core has exited (reported as a death unless shutdown() is under way)."""
        code = self.proc.poll() if self.proc else None
        if code is None:
            return False
        self._stop_watching()  # a descriptor stays readable: watching on would call this in a loop
        if not self._closing:
            self.on_dead(f"the engine core process exited with code {code}")
        return True

    def _stop_watching(self) -> None:
        if self._pidfd is not None:
            asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None

    def _check_progress(self) -> None:
        now = time.monotonic()
        period = self.watchdog_timeout / WATCHDOG_CHECKS
        if not self.busy():
            self._last_progress = now
        elif now - self._last_progress > self.watchdog_timeout + period:
            self._watchdog = None
            self._stop_watching()  # the kill below is this death, not a second one
            if self.proc and self.proc.poll() is None:
                self.proc.kill()
            self.on_dead(
                f"the engine core made no progress for {now - self._last_progress:.0f} s with requests "
                f"waiting (--engine-watchdog-timeout {self.watchdog_timeout:g}); it was killed"
            )
            return
        self._watchdog = asyncio.get_running_loop().call_later(period, self._check_progress)

    def send(self, msg) -> None:
        self._input.send(input_encoder.encode(msg), zmq.NOBLOCK, copy=False)

    def _drain_output(self) -> None:
        """Reader callback. ZMQ's descriptor signals edges, not levels: it is re-armed only once the
        socket's ZMQ_EVENTS reads without POLLIN, so this reads until it does. Asking ZMQ_EVENTS
        costs less than the zmq.Again a receive on an empty socket raises (once per engine step).
        Events are small: copied bytes cost less than a zero-copy Frame."""
        self._last_progress = time.monotonic()
        sock = self._output
        while not sock.closed and sock.getsockopt(_EVENTS) & _POLLIN:
            try:
                msg = sock.recv(zmq.NOBLOCK)
            except zmq.Again:  # not expected after POLLIN (one reader); the next edge retries
                return
            try:
                event = event_decoder.decode(msg)
            except Exception as e:
                logger.error("undecodable message from the engine core: %s", e)
                continue
            try:
                self.on_event(event)
            except Exception:
                logger.exception("error while handling an engine-core event")

    async def _watch_loop(self) -> None:
        while not self._check_exit():
            await asyncio.sleep(WATCH_INTERVAL_S)

    async def shutdown(self, timeout: float = 5.0) -> None:
        self._closing = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self.proc and self.proc.poll() is None:
            with contextlib.suppress(zmq.ZMQError):
                self.send(Shutdown())
            for _ in range(int(timeout / 0.05)):
                if self.proc.poll() is not None:
                    break
                await asyncio.sleep(0.05)
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(2)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        self._stop_watching()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._reader_fd is not None:
            asyncio.get_running_loop().remove_reader(self._reader_fd)
            self._reader_fd = None
        self._input.close(0)
        self._output.close(0)
        self._sync_ctx.term()
        shutil.rmtree(self._tmpdir, ignore_errors=True)
