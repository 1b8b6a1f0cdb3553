"""The in-memory tier (`--swap-space GB`): encoded blocks by hash, least recently used first out. The
bound counts the stored arrays' bytes exactly (Python's per-object overhead aside): a put that would pass
it evicts from the LRU end first, and a block larger than the whole bound is not kept."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np


class MemoryTier:
    def __init__(self, capacity_bytes: int):
        self.capacity = int(capacity_bytes)
        self.nbytes = 0
        self._blocks: OrderedDict[bytes, list[np.ndarray]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self._blocks

    def get(self, block_hash: bytes) -> list[np.ndarray] | None:
        stored = self._blocks.get(block_hash)
        if stored is not None:
            self._blocks.move_to_end(block_hash)
        return stored

    def put(self, block_hash: bytes, stored: list[np.ndarray]) -> list[tuple[bytes, list[np.ndarray]]]:
        """Keep a block (replacing one of that hash); returns the blocks evicted to make room."""
        size = sum(a.nbytes for a in stored)
        self.pop(block_hash)
        if size > self.capacity:
            return []
        evicted = []
        while self.nbytes + size > self.capacity:
            h, old = self._blocks.popitem(last=False)
            self.nbytes -= sum(a.nbytes for a in old)
            evicted.append((h, old))
        self._blocks[block_hash] = stored
        self.nbytes += size
        return evicted

    def pop(self, block_hash: bytes) -> list[np.ndarray] | None:
        stored = self._blocks.pop(block_hash, None)
        if stored is not None:
            self.nbytes -= sum(a.nbytes for a in stored)
        return stored
