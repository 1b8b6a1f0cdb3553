"""The prefill side's sender: one thread that sends each finished prompt's blocks to the decode
instance named in its request, so the engine thread only copies blocks out of the pool.

One zmq PUSH socket per destination. A destination that does not take frames within `timeout_s`
loses that transfer (its decode request recomputes after its own wait), never the engine's time.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass

import numpy as np
import zmq

from fdcli_engine.kv_transfer.pd.messages import ENCODER, TransferBlock, TransferEnd, TransferStart

logger = logging.getLogger(__name__)

MAX_QUEUED = 64  # transfers waiting for the thread; more are dropped (their requests recompute)


@dataclass
class Outgoing:
    address: str
    transfer_id: str
    prompt_token_ids: list[int]
    block_size: int
    part_specs: list[str]
    blocks: list[list[np.ndarray]]


class Sender:
    def __init__(self, token: str, timeout_s: float):
        self.token = token
        self.timeout_ms = int(timeout_s * 1000)
        self.num_sent = 0
        self.num_failed = 0
        self.num_bytes = 0
        self._ctx = zmq.Context.instance()
        self._socks: dict[str, zmq.Socket] = {}
        self._queue: queue.Queue[Outgoing | None] = queue.Queue(MAX_QUEUED)
        self._thread = threading.Thread(target=self._run, name="fd-kv-sender", daemon=True)
        self._thread.start()

    def submit(self, out: Outgoing) -> None:
        try:
            self._queue.put_nowait(out)
        except queue.Full:
            self.num_failed += 1
            logger.warning("KV transfer %s dropped: %d transfers already queued", out.transfer_id, MAX_QUEUED)

    def frames(self, out: Outgoing):
        """The frames of one transfer, in order."""
        tid, token = out.transfer_id, self.token
        yield TransferStart(tid, token, out.prompt_token_ids, len(out.blocks), out.block_size, out.part_specs)
        for i, parts in enumerate(out.blocks):
            yield TransferBlock(tid, token, i, [np.ascontiguousarray(p).tobytes() for p in parts])
        yield TransferEnd(tid, token)

    def _run(self) -> None:
        while (out := self._queue.get()) is not None:
            try:
                self._send(out)
                self.num_sent += 1
            except zmq.ZMQError as e:
                self.num_failed += 1
                logger.warning("KV transfer %s to %s failed: %s", out.transfer_id, out.address, e)
                self._forget(out.address)
        for sock in self._socks.values():
            sock.close(0)

    def _send(self, out: Outgoing) -> None:
        sock = self._socket(out.address)
        for frame in self.frames(out):
            data = ENCODER.encode(frame)
            sock.send(data)  # raises zmq.Again after timeout_ms when the peer takes nothing
            self.num_bytes += len(data)

    def _socket(self, address: str) -> zmq.Socket:
        sock = self._socks.get(address)
        if sock is None:
            sock = self._ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, self.timeout_ms)
            sock.setsockopt(zmq.SNDTIMEO, self.timeout_ms)
            sock.setsockopt(zmq.SNDHWM, 256)
            sock.connect(address)
            self._socks[address] = sock
        return sock

    def _forget(self, address: str) -> None:
        sock = self._socks.pop(address, None)
        if sock is not None:
            sock.close(0)

    def close(self) -> None:
        if self._thread.is_alive():
            try:
                self._queue.put(None, timeout=1)
            except queue.Full:
                return
            self._thread.join(timeout=5)
