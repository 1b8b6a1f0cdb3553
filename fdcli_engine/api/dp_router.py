"""Data-parallel routing: which engine-core rank a new request goes to.

Rule: among the live ranks, the one with the fewest outstanding requests, where a rank that already holds
part of the prompt's prefix counts as less loaded by up to AFFINITY_SLACK requests, in proportion to the
share of the prompt's tokens it holds (a rank holding the whole prompt wins unless it has AFFINITY_SLACK or
more requests beyond the least-loaded rank; a shared chat-template preamble of a few blocks never outweighs
a whole request of imbalance). The share counts tokens, the partial last block included: over full blocks
only, a short chat whose one full block after the preamble differs would count the preamble as half of it.
Ties go to the less-loaded rank, then the lower one: a tie means the cached prefix is worth exactly the
imbalance, and spreading the load then keeps an idle rank from staying idle.

What a rank holds is estimated, not asked: per rank a bounded LRU of the block hashes of the prompts
sent there. The hashes follow the engine's prefix-cache rule exactly (Request.update_block_hashes: the
same block size, the chained keyed hash, the cache salt in the first block), so two prompts match here
as far as they would share cached blocks in the core. The hash key is this process's (prefix_hash.py),
which only matters for comparing prompts with each other, never with the core's own hashes.
"""

from __future__ import annotations

from collections import OrderedDict

from fdcli_engine.request import Request
from fdcli_engine.sampling_params import SamplingParams

AFFINITY_SLACK = 2.0
DEFAULT_LRU_BLOCKS = 8192  # per rank, when the config gives no --num-kv-blocks


class DPRouter:
    def __init__(self, num_ranks: int, block_size: int, prefix_caching: bool, lru_blocks: int | None = None):
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.lru_blocks = max(1, lru_blocks or DEFAULT_LRU_BLOCKS)
        self._held: list[OrderedDict[bytes, None]] = [OrderedDict() for _ in range(num_ranks)]

    def block_hashes(self, prompt_token_ids: list[int], params, mm_features=None) -> list[bytes]:
        """The prompt's full-block hashes as the engine's prefix cache computes them (images included)."""
        if not self.prefix_caching:
            return []
        sampling = params if isinstance(params, SamplingParams) else None
        req = Request("", prompt_token_ids, sampling, max_model_len=1 << 30, mm_features=mm_features)
        return req.update_block_hashes(self.block_size)

    def matched_blocks(self, rank: int, hashes: list[bytes]) -> int:
        """Leading blocks of the prompt that `rank` is thought to hold (chained: stop at the first miss)."""
        held = self._held[rank]
        n = 0
        for h in hashes:
            if h not in held:
                break
            n += 1
        return n

    def pick(self, hashes: list[bytes], loads: list[int | None], num_tokens: int | None = None) -> int:
        """The rank for a prompt of `num_tokens` tokens (default: its full blocks) with `hashes`;
        `loads[r]` is rank r's outstanding requests, None if dead. ValueError when no rank is live."""
        tokens = max(num_tokens or 0, len(hashes) * self.block_size)
        best, best_key = -1, (0.0, 0)
        for rank, load in enumerate(loads):
            if load is None:
                continue
            share = self.matched_blocks(rank, hashes) * self.block_size / tokens if hashes else 0.0
            key = (load - AFFINITY_SLACK * share, load)
            if best < 0 or key < best_key:
                best, best_key = rank, key
        if best < 0:
            raise ValueError("no live data-parallel rank")
        return best

    def record(self, rank: int, hashes: list[bytes]) -> None:
        """`rank` now holds these blocks (most recently used); the oldest fall out past the bound."""
        held = self._held[rank]
        for h in hashes:
            held[h] = None
            held.move_to_end(h)
        while len(held) > self.lru_blocks:
            held.popitem(last=False)

    def forget(self, rank: int) -> None:
        """A dead rank's cache is gone."""
        self._held[rank].clear()
