"""Maps requests to KV-cache blocks: prefix-cache lookup, slot allocation, freeing.

A request's block table covers its first `num_computed_tokens + scheduled` tokens. Full blocks are
registered in the pool under their chained hash as soon as they are allocated for known tokens: within a
step, every layer writes all new K/V before any attention reads them, so a block filled in this step is
already safe to share with a request scheduled in the same step.

A bound KV connector (kv_transfer/base.py) hears of every freed request before its blocks return to the
pool, and of every cached block before the pool reuses it (BlockPool.on_evict).
"""

from __future__ import annotations

from fdcli_engine.core.block_pool import BlockPool
from fdcli_engine.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True):
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.pool = BlockPool(num_blocks, enable_caching)
        self.prefix_cache_queries = 0  # prompt tokens looked up
        self.prefix_cache_hits = 0  # of which found cached
        self.connector = None
        # Per request: how many of its leading blocks are registered under their hash. A block a request
        # holds keeps its hash until its last holder frees it (the pool evicts only free blocks), so
        # those need no new look every step; `free` forgets the count.
        self._registered: dict[str, int] = {}

    def bind_connector(self, connector) -> None:
        self.connector = connector
        self.pool.on_evict = connector.on_evict if connector is not None else None

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def usage(self) -> float:
        return self.pool.usage()

    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """Longest cached prefix of the request's tokens, in whole blocks. At least one token is left
        to compute, since the last position's logits are needed to sample. A request asking for prompt
        logprobs takes no hit (as in vLLM): every prompt row's hidden state is needed."""
        if not self.enable_caching or request.wants_prompt_logprobs:
            return [], 0
        hashes = request.update_block_hashes(self.block_size)
        max_blocks = (request.num_tokens - 1) // self.block_size
        hit: list[int] = []
        for h in hashes[:max_blocks]:
            bid = self.pool.get_cached_block(h)
            if bid is None:
                break
            hit.append(bid)
        return hit, len(hit) * self.block_size

    def num_recomputed_tokens(self, request: Request, num_hit_tokens: int) -> int:
        """Tokens the cache holds that the request's prefill computes again: the last block of a prompt
        whose every block is cached, which get_computed_blocks leaves out (one token must be computed
        for the logits, and hits are whole blocks). 0 for any other hit."""
        bs = self.block_size
        last = request.num_tokens // bs - 1
        if not self.enable_caching or request.num_tokens % bs or num_hit_tokens != last * bs:
            return 0
        hashes = request.update_block_hashes(bs)
        return bs if self.pool.get_cached_block(hashes[last]) is not None else 0

    def record_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        """Count a lookup once its request is actually scheduled (a failed attempt is retried)."""
        self.prefix_cache_queries += num_tokens
        self.prefix_cache_hits += num_hit_tokens

    def allocate_slots(
        self, request: Request, num_new_tokens: int, computed_block_ids: list[int] | None = None
    ) -> bool:
        """Make room for `num_new_tokens` more tokens after the computed ones (plus any prefix-cache hit
        in `computed_block_ids`, which must start the table of a request that has no blocks yet).
        Returns False, changing nothing, if the pool cannot supply the blocks."""
        computed_block_ids = computed_block_ids or []
        num_hit_tokens = len(computed_block_ids) * self.block_size
        total = request.num_computed_tokens + num_hit_tokens + num_new_tokens
        num_needed = cdiv(total, self.block_size) - len(request.block_ids) - len(computed_block_ids)
        # Touching a free cached block takes it out of the free queue, so it no longer counts as free.
        num_hit_free = sum(1 for b in computed_block_ids if self.pool.blocks[b].ref_cnt == 0)
        if max(num_needed, 0) > self.pool.num_free_blocks - num_hit_free:
            return False
        if computed_block_ids:
            self.pool.touch(computed_block_ids)
            request.block_ids.extend(computed_block_ids)
        if num_needed > 0:
            request.block_ids.extend(self.pool.allocate(num_needed))
        self._cache_full_blocks(request, total)
        return True

    def _cache_full_blocks(self, request: Request, num_tokens: int) -> None:
        if not self.enable_caching:
            return
        hashes = request.update_block_hashes(self.block_size)
        done = self._registered.get(request.req_id, 0)
        ids, blocks = request.block_ids, self.pool.blocks
        for i in range(done, min(num_tokens // self.block_size, len(hashes))):
            self.pool.cache_block(ids[i], hashes[i])
            # A block whose hash another block owns stays unregistered and is offered again next time.
            if done == i and blocks[ids[i]].block_hash is not None:
                done = i + 1
        self._registered[request.req_id] = done

    def free(self, request: Request) -> None:
        if self.connector is not None:
            self.connector.request_finished(request)
        self.pool.free(list(reversed(request.block_ids)))
        request.block_ids = []
        self._registered.pop(request.req_id, None)

    def reset_prefix_cache(self) -> None:
        self.pool.reset_prefix_cache()
