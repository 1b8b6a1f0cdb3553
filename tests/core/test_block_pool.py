"""Block pool and KV cache manager with exact block ids."""

import pytest

from fdcli_engine.core.block_pool import BlockPool
from fdcli_engine.core.kv_cache_manager import KVCacheManager
from fdcli_engine.prefix_hash import hash_block_tokens
from fdcli_engine.request import Request
from fdcli_engine.sampling_params import SamplingParams


def make_req(rid, tokens, max_model_len=1024):
    return Request(rid, tokens, SamplingParams(max_tokens=8), max_model_len=max_model_len)


def test_allocate_in_order_and_free_to_lru_tail():
    pool = BlockPool(6)
    assert pool.allocate(3) == [0, 1, 2]
    assert pool.num_free_blocks == 3
    pool.free([2, 1, 0])
    # Freed blocks go to the back of the queue, in the order given.
    assert pool.free_block_ids() == [3, 4, 5, 2, 1, 0]
    assert pool.allocate(4) == [3, 4, 5, 2]


def test_ref_counts_and_double_free():
    pool = BlockPool(4)
    [b] = pool.allocate(1)
    pool.touch([b])
    assert pool.blocks[b].ref_cnt == 2
    pool.free([b])
    assert b not in pool.free_block_ids()
    pool.free([b])
    assert pool.free_block_ids()[-1] == b
    with pytest.raises(RuntimeError):
        pool.free([b])


def test_cached_block_survives_free_until_reallocated():
    pool = BlockPool(3)
    h = hash_block_tokens(None, [1, 2, 3, 4])
    [b0] = pool.allocate(1)
    pool.cache_block(b0, h)
    pool.free([b0])
    assert pool.get_cached_block(h) == b0
    # Touching a free cached block takes it out of the free queue.
    pool.touch([b0])
    assert b0 not in pool.free_block_ids()
    pool.free([b0])
    # Allocation evicts in LRU order: blocks 1 and 2 (never used) go first, then the cached block 0.
    assert pool.allocate(2) == [1, 2]
    assert pool.get_cached_block(h) == b0
    assert pool.allocate(1) == [0]
    assert pool.get_cached_block(h) is None
    assert pool.blocks[0].block_hash is None


def test_hash_chain_depends_on_whole_prefix():
    a = hash_block_tokens(None, [1, 2])
    b = hash_block_tokens(None, [1, 3])
    assert hash_block_tokens(a, [5, 6]) != hash_block_tokens(b, [5, 6])
    assert hash_block_tokens(a, [5, 6]) == hash_block_tokens(hash_block_tokens(None, [1, 2]), [5, 6])
    assert len(a) == 32


def test_manager_prefix_hit_shares_blocks():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    r1 = make_req("a", list(range(10)))  # 2 full blocks + 2 tokens
    assert kv.get_computed_blocks(r1) == ([], 0)
    assert kv.allocate_slots(r1, 10)
    assert r1.block_ids == [0, 1, 2]
    r2 = make_req("b", list(range(8)) + [99, 98, 97])
    hit, n = kv.get_computed_blocks(r2)
    assert (hit, n) == ([0, 1], 8)
    assert kv.allocate_slots(r2, r2.num_tokens - n, hit)
    assert r2.block_ids == [0, 1, 3]
    assert kv.pool.blocks[0].ref_cnt == 2 and kv.pool.blocks[3].ref_cnt == 1
    kv.free(r1)
    assert kv.pool.blocks[0].ref_cnt == 1
    # r1's private tail block 2 was freed first (reverse order), and is next in line after unused ones.
    assert kv.pool.free_block_ids()[-1] == 2


def test_manager_leaves_one_token_to_compute():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    r1 = make_req("a", list(range(8)))
    assert kv.allocate_slots(r1, 8)
    r2 = make_req("b", list(range(8)))
    hit, n = kv.get_computed_blocks(r2)
    # All 8 tokens are cached, but the last block is recomputed so the last position yields logits.
    assert (hit, n) == ([0], 4)


def test_manager_refuses_without_side_effects():
    kv = KVCacheManager(num_blocks=3, block_size=4)
    r1 = make_req("a", list(range(8)))
    assert kv.allocate_slots(r1, 8)
    r2 = make_req("b", list(range(100, 109)))
    assert not kv.allocate_slots(r2, 9)
    assert r2.block_ids == [] and kv.num_free_blocks == 1


def test_free_hit_blocks_do_not_count_as_free():
    kv = KVCacheManager(num_blocks=3, block_size=4)
    r1 = make_req("a", list(range(9)))
    assert kv.allocate_slots(r1, 9)
    kv.free(r1)
    r2 = make_req("b", list(range(8)) + [50, 51, 52, 53, 54])
    hit, n = kv.get_computed_blocks(r2)
    assert hit == [0, 1]
    # 13 tokens need 4 blocks; only 3 exist, and the two hits are among the free ones.
    assert not kv.allocate_slots(r2, 5, hit)
    assert kv.num_free_blocks == 3 and r2.block_ids == []


def test_disabled_caching_never_hits():
    kv = KVCacheManager(num_blocks=10, block_size=4, enable_caching=False)
    r1 = make_req("a", list(range(10)))
    assert kv.allocate_slots(r1, 10)
    r2 = make_req("b", list(range(10)))
    assert kv.get_computed_blocks(r2) == ([], 0)
    assert kv.pool.cached == {}


class _RescanEveryStep(KVCacheManager):
    """The reference: every full block of a request offered to the pool again on every allocation."""

    def _cache_full_blocks(self, request, num_tokens):
        self._registered.clear()
        super()._cache_full_blocks(request, num_tokens)


def test_registering_only_new_blocks_matches_a_rescan_every_step():
    # Requests with equal token streams (their blocks' hashes are owned by whichever registered first,
    # so the others stay unregistered until that owner's blocks are evicted), preempted and resumed,
    # finishing while the rest decode: the pool's hash table must end every step as a full rescan's.
    import random

    rng = random.Random(3)
    managers = [KVCacheManager(24, 4), _RescanEveryStep(24, 4)]
    live: list[list[Request]] = [[], []]
    for step in range(400):
        if len(live[0]) < 4 and rng.random() < 0.3:
            prompt = [rng.choice([7, 8]) for _ in range(rng.randint(1, 9))]
            rid = f"r{step}"
            for m, reqs in zip(managers, live):
                r = make_req(rid, prompt)
                if m.allocate_slots(r, r.num_tokens):
                    r.num_computed_tokens = r.num_tokens
                    reqs.append(r)
        token = rng.choice([7, 8])
        leave = {r.req_id for r in live[0] if rng.random() < 0.05}
        for m, reqs in zip(managers, live):
            for r in list(reqs):
                r.append_output_token(token)
                if r.req_id in leave or not m.allocate_slots(r, 1):
                    m.free(r)
                    reqs.remove(r)
                else:
                    r.num_computed_tokens += 1
        assert [r.req_id for r in live[0]] == [r.req_id for r in live[1]], f"step {step}"
        assert [r.block_ids for r in live[0]] == [r.block_ids for r in live[1]], f"step {step}"
        assert managers[0].pool.cached == managers[1].pool.cached, f"step {step}"
