"""Transfers a decode instance has received, held until their request takes them (bounded in bytes).

Shared by the receiver thread (which adds frames) and the engine thread (which asks and takes), so
every method holds one lock. A transfer is `pending` while frames arrive, `complete` after its end
frame, `failed` when it broke a rule (layout, order, the byte bound): a failed transfer keeps no
bytes, and its request recomputes. Transfers nobody claims are dropped after `ttl_s`.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from fdcli_engine.kv_transfer.pd.messages import TransferBlock, TransferStart

PENDING, COMPLETE, FAILED = "pending", "complete", "failed"


@dataclass
class Staged:
    prompt_token_ids: list[int]
    num_blocks: int
    blocks: list[list[bytes]] = field(default_factory=list)
    nbytes: int = 0
    state: str = PENDING
    last_frame: float = field(default_factory=time.monotonic)


class Staging:
    def __init__(self, max_bytes: int, part_specs: list[str], part_nbytes: list[int], ttl_s: float):
        self.max_bytes = max_bytes
        self.part_specs = part_specs
        self.part_nbytes = part_nbytes
        self.ttl_s = ttl_s
        self.nbytes = 0
        self.num_refused = 0
        self._lock = threading.Lock()
        self._staged: dict[str, Staged] = {}

    # ---- the receiver thread ----
    def start(self, msg: TransferStart) -> None:
        with self._lock:
            self._drop(msg.transfer_id)
            staged = Staged(list(msg.prompt_token_ids), msg.num_blocks)
            self._staged[msg.transfer_id] = staged
            if msg.part_specs != self.part_specs:
                self._fail(staged)

    def block(self, msg: TransferBlock) -> None:
        with self._lock:
            staged = self._staged.get(msg.transfer_id)
            if staged is None or staged.state != PENDING:
                return
            staged.last_frame = time.monotonic()
            size = sum(len(p) for p in msg.parts)
            if (
                msg.index != len(staged.blocks)
                or msg.index >= staged.num_blocks
                or [len(p) for p in msg.parts] != self.part_nbytes
                or self.nbytes + size > self.max_bytes
            ):
                self._fail(staged)
                return
            staged.blocks.append(msg.parts)
            staged.nbytes += size
            self.nbytes += size

    def end(self, transfer_id: str) -> None:
        with self._lock:
            staged = self._staged.get(transfer_id)
            if staged is not None and staged.state == PENDING:
                if len(staged.blocks) == staged.num_blocks:
                    staged.state = COMPLETE
                else:
                    self._fail(staged)

    # ---- the engine thread ----
    def get(self, transfer_id: str) -> Staged | None:
        with self._lock:
            self._expire()
            return self._staged.get(transfer_id)

    def drop(self, transfer_id: str) -> None:
        with self._lock:
            self._drop(transfer_id)

    def __len__(self) -> int:
        with self._lock:
            return len(self._staged)

    # ---- under the lock ----
    def _fail(self, staged: Staged) -> None:
        self.nbytes -= staged.nbytes
        staged.blocks, staged.nbytes, staged.state = [], 0, FAILED
        self.num_refused += 1

    def _drop(self, transfer_id: str) -> None:
        staged = self._staged.pop(transfer_id, None)
        if staged is not None:
            self.nbytes -= staged.nbytes

    def _expire(self) -> None:
        """A transfer cut halfway, or one whose request never came, is dropped after ttl_s."""
        now = time.monotonic()
        for tid in [t for t, s in self._staged.items() if now - s.last_frame > self.ttl_s]:
            self._drop(tid)
