"""The KV connector: the one way KV blocks leave an engine's pool and come back in.

vLLM v1 splits this into a scheduler-side and a worker-side object because its pool lives in another
process; fd's scheduler and KV pool share one process, so one object serves both. Every call is made
on the engine thread, between steps, so a call sees the pool as no step is writing it.

The scheduler calls it at these points:
- admission, after the pool's own prefix hit of `num_computed_tokens` tokens:
  `get_num_new_matched_tokens(request, num_computed_tokens)` says how many more tokens, in whole
  blocks directly after the hit, this connector can supply. `None` means "not known yet" (a transfer
  still arriving): the request waits without holding up the requests behind it. At least one prompt
  token is always left to compute (its logits are sampled), so the scheduler caps what it asks for.
- `load(request, block_hashes, block_ids)`, once the scheduler has allocated pool blocks for the
  matched tokens: write each block's K/V into the pool through the views given to `bind`, in order,
  and return how many leading blocks were written. The scheduler computes the rest in the same step:
  a failed or partial load costs time, never correctness.
- `on_evict(block_hash, block_id)`: a cached block whose K/V are still intact is about to be reused
  for other tokens: the last moment to save it.
- `request_finished(request)`: a request ended or was preempted, before its blocks are freed; its
  `block_ids` and block hashes still describe valid K/V for its first `num_computed_tokens` tokens.

Blocks are named by their chained prefix hash (`Request.update_block_hashes`), which covers the whole
prefix, cache salt and image content included: equal hashes mean interchangeable K/V.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class KVBlockViews:
    """Numpy views of every KV cache tensor of the pool, block id first (axis 0). bf16 tensors are
    viewed as their uint16 bits and int8 caches include their scale tensors, so a block's parts copy
    bit-exactly in both directions. Writing a view writes the pool."""

    arrays: list[np.ndarray]
    block_size: int

    @property
    def block_nbytes(self) -> int:
        return sum(a[0].nbytes for a in self.arrays)

    def read(self, block_id: int) -> list[np.ndarray]:
        """Copies of one block's parts, one per cache tensor."""
        return [a[block_id].copy() for a in self.arrays]

    def write(self, block_id: int, parts: list[np.ndarray]) -> None:
        if len(parts) != len(self.arrays):
            raise ValueError(f"a block has {len(self.arrays)} parts, got {len(parts)}")
        for a, p in zip(self.arrays, parts):
            a[block_id] = p


class KVConnector:
    """One source and sink of KV blocks outside the pool (see the module docstring for the calls).
    The base class supplies nothing and saves nothing."""

    def bind(self, views: KVBlockViews) -> None:
        """Called once, before the first step, with the pool's views."""
        self.views = views

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> int | None:
        return 0

    def load(self, request, block_hashes: list[bytes], block_ids: list[int]) -> int:
        return 0

    def on_evict(self, block_hash: bytes, block_id: int) -> None:
        """Default: an evicted block is dropped."""

    def request_finished(self, request) -> None:
        """Default: nothing to save."""

    def stats(self) -> dict:
        """Counters for /metrics and get_stats (names as FastDeploy/vLLM export them)."""
        return {}

    def close(self) -> None:
        """Stop threads and release sockets or files (idempotent)."""
