"""The pool of KV-cache blocks: reference counts, a free queue in LRU order, and the map from block
hash to cached block.

Invariants:
- A block is in the free queue iff its ref_cnt is 0.
- A free block may still hold a hash (its K/V are a valid cached prefix) until it is reallocated; the
  queue's front is the least recently freed block, so allocation evicts cached blocks in LRU order.
- `cached` maps each hash to at most one block, and a block holds at most one hash.
- `on_evict(hash, block_id)`, when set (a KV connector's), runs before an allocation reuses a cached
  block, while its K/V are still intact. `reset_prefix_cache` forgets hashes without calling it: a reset
  asks for the cache to be dropped, not moved elsewhere.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class KVBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool = True):
        if num_blocks < 1:
            raise ValueError("a block pool needs at least one block")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[bytes, int] = {}
        self.on_evict = None

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def usage(self) -> float:
        return 1.0 - len(self._free) / self.num_blocks

    def free_block_ids(self) -> list[int]:
        """Free blocks, next to be allocated first (for tests and debugging)."""
        return list(self._free)

    def get_cached_block(self, block_hash: bytes) -> int | None:
        return self.cached.get(block_hash) if self.enable_caching else None

    def touch(self, block_ids: list[int]) -> None:
        """Take a reference on cached blocks found by hash (removing free ones from the queue)."""
        for bid in block_ids:
            blk = self.blocks[bid]
            if blk.ref_cnt == 0:
                del self._free[bid]
            blk.ref_cnt += 1

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise RuntimeError(f"asked for {n} blocks with {len(self._free)} free")
        out = []
        for _ in range(n):
            bid, _ = self._free.popitem(last=False)
            blk = self.blocks[bid]
            if blk.block_hash is not None and self.on_evict is not None:
                self.on_evict(blk.block_hash, bid)
            self._evict(blk)
            blk.ref_cnt = 1
            out.append(bid)
        return out

    def free(self, block_ids: list[int]) -> None:
        """Drop one reference from each block. Callers pass a sequence's blocks tail first, so a
        sequence's last blocks (the least shareable) are evicted before its first ones."""
        for bid in block_ids:
            blk = self.blocks[bid]
            if blk.ref_cnt <= 0:
                raise RuntimeError(f"block {bid} freed more often than allocated")
            blk.ref_cnt -= 1
            if blk.ref_cnt == 0:
                self._free[bid] = None

    def cache_block(self, block_id: int, block_hash: bytes) -> None:
        """Register a full block under its hash. A hash already owned by another block stays there."""
        if not self.enable_caching:
            return
        blk = self.blocks[block_id]
        if blk.block_hash is not None or block_hash in self.cached:
            return
        blk.block_hash = block_hash
        self.cached[block_hash] = block_id

    def _evict(self, blk: KVBlock) -> None:
        if blk.block_hash is not None:
            if self.cached.get(blk.block_hash) == blk.block_id:
                del self.cached[blk.block_hash]
            blk.block_hash = None

    def reset_prefix_cache(self) -> None:
        for blk in self.blocks:
            if blk.ref_cnt == 0:
                self._evict(blk)
