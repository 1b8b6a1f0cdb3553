"""The decode side's receiver: one thread on a bound zmq PULL socket that checks each frame's token
and puts its blocks in the staging area. Frames are msgspec-typed; anything else is dropped."""

from __future__ import annotations

import contextlib
import hmac
import logging
import os
import threading

import msgspec
import zmq

from fdcli_engine.kv_transfer.pd.messages import DECODER, TransferBlock, TransferEnd, TransferStart
from fdcli_engine.kv_transfer.pd.staging import Staging

logger = logging.getLogger(__name__)

MAX_FRAME_BYTES = 1 << 30  # zmq refuses a larger message before it is read


class Receiver:
    def __init__(self, address: str, token: str, staging: Staging):
        self.token = token.encode()
        self.staging = staging
        self.num_bad_frames = 0
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.PULL)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        self._sock.bind(address)
        self.address = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fd-kv-receiver", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            try:
                self._on_frame(self._sock.recv(copy=True))
            except Exception:  # noqa: BLE001 - one bad frame never stops the receiver
                logger.exception("KV transfer frame dropped")
        self._sock.close(0)

    def _on_frame(self, data: bytes) -> None:
        try:
            msg = DECODER.decode(data)
        except msgspec.DecodeError:
            self.num_bad_frames += 1
            return
        if not hmac.compare_digest(msg.token.encode(), self.token):
            self.num_bad_frames += 1
            if isinstance(msg, TransferStart):
                logger.warning("KV transfer %s refused: wrong token", msg.transfer_id)
            return
        if isinstance(msg, TransferStart):
            self.staging.start(msg)
        elif isinstance(msg, TransferBlock):
            self.staging.block(msg)
        elif isinstance(msg, TransferEnd):
            self.staging.end(msg.transfer_id)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)
        if self.address.startswith("ipc://") and not self._thread.is_alive():
            with contextlib.suppress(OSError):  # the socket file, so its name is free again
                os.unlink(self.address[len("ipc://") :])
