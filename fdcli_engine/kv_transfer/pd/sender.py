"""The prefill side's sender: threads that send each finished prompt's blocks to the decode instance
named in its request, so the engine thread only copies blocks out of the pool.

One thread and one zmq PUSH socket per destination: a decode instance that takes no frames (dead, or
gone) stalls only the transfers meant for it. A destination that takes nothing for `timeout_s` loses
that transfer (its decode request recomputes after its own wait), never the engine's time.
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

MAX_QUEUED = 64  # transfers waiting for one destination; more are dropped (their requests recompute)
MAX_DESTINATIONS = 256


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
        self._lock = threading.Lock()  # the counters; destinations are added on the engine thread only
        self._lanes: dict[str, tuple[queue.Queue, threading.Thread]] = {}

    def submit(self, out: Outgoing) -> None:
        lane = self._lanes.get(out.address)
        if lane is None:
            if len(self._lanes) >= MAX_DESTINATIONS:
                self._failed(out, f"more than {MAX_DESTINATIONS} destinations")
                return
            q: queue.Queue = queue.Queue(MAX_QUEUED)
            t = threading.Thread(target=self._run, args=(out.address, q), name="fd-kv-sender", daemon=True)
            lane = self._lanes[out.address] = (q, t)
            t.start()
        try:
            lane[0].put_nowait(out)
        except queue.Full:
            self._failed(out, f"{MAX_QUEUED} transfers already queued for {out.address}")

    def frames(self, out: Outgoing):
        """The frames of one transfer, in order."""
        tid, token = out.transfer_id, self.token
        yield TransferStart(tid, token, out.prompt_token_ids, len(out.blocks), out.block_size, out.part_specs)
        for i, parts in enumerate(out.blocks):
            yield TransferBlock(tid, token, i, [np.ascontiguousarray(p).tobytes() for p in parts])
        yield TransferEnd(tid, token)

    def _run(self, address: str, q: queue.Queue) -> None:
        sock = None
        while (out := q.get()) is not None:
            try:
                sock = sock or self._socket(address)
                nbytes = 0
                for frame in self.frames(out):
                    data = ENCODER.encode(frame)
                    sock.send(data)  # zmq.Again after timeout_ms when the peer takes nothing
                    nbytes += len(data)
                with self._lock:
                    self.num_sent += 1
                    self.num_bytes += nbytes
            except zmq.ZMQError as e:
                self._failed(out, str(e))
                if sock is not None:
                    sock.close(0)  # a fresh socket for the next transfer: no half transfer queued
                sock = None
        if sock is not None:
            sock.close(self.timeout_ms)

    def _socket(self, address: str) -> zmq.Socket:
        sock = self._ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, self.timeout_ms)
        sock.setsockopt(zmq.SNDTIMEO, self.timeout_ms)
        sock.setsockopt(zmq.SNDHWM, 256)
        sock.connect(address)
        return sock

    def _failed(self, out: Outgoing, why: str) -> None:
        with self._lock:
            self.num_failed += 1
        logger.warning("KV transfer %s to %s failed: %s", out.transfer_id, out.address, why)

    def close(self) -> None:
        for q, _ in self._lanes.values():
            try:
                q.put(None, timeout=1)
            except queue.Full:
                continue
        for _, t in self._lanes.values():
            t.join(timeout=5)
