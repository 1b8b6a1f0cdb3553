"""A running request's step through the scheduler and the KV cache manager (no prefix hit, no drafts, no
lookahead): block tables grow exactly at block boundaries, a
pool too small refuses without changing anything, full blocks register in the prefix cache when it is
on, and each step's ScheduledRequest holds the request's own last token in a list of its own."""

import pytest

from fdcli_engine.core.kv_cache_manager import KVCacheManager
from fdcli_engine.core.scheduler import Scheduler
from fdcli_engine.request import Request
from fdcli_engine.sampling_params import SamplingParams
from fdcli_engine.step_types import ModelRunnerOutput

BS = 4


def cdiv(a, b):
    return -(-a // b)


@pytest.mark.parametrize("caching", [False, True])
def test_decode_steps_grow_blocks_at_boundaries(caching):
    kv = KVCacheManager(16, BS, enable_caching=caching)
    sched = Scheduler(kv, 4, 64, max_model_len=64)
    prompt = [1, 2, 3, 4, 5, 6]
    req = Request("a", prompt, SamplingParams(max_tokens=11, ignore_eos=True), max_model_len=64)
    sched.add_request(req)
    steps = 0
    while sched.has_unfinished_requests():
        so = sched.schedule()
        (sr,) = so.scheduled
        assert sr.num_computed_tokens == req.num_computed_tokens
        assert sr.token_ids == req.all_token_ids[sr.num_computed_tokens :]
        assert sr.spec_token_ids == [] and sr.num_drafts_wanted == 0
        assert sr.token_ids is not req.all_token_ids and sr.block_ids is not req.block_ids
        # Blocks for every token computed after this step, not one more.
        assert len(req.block_ids) == cdiv(sr.num_computed_tokens + len(sr.token_ids), BS)
        assert sr.block_ids == req.block_ids
        if caching:
            full = (sr.num_computed_tokens + len(sr.token_ids)) // BS
            assert [kv.pool.blocks[b].block_hash for b in req.block_ids[:full]] == req.block_hashes[:full]
        token = 100 + steps
        sched.update_from_output(so, ModelRunnerOutput(sampled_token_ids={"a": [token]}))
        steps += 1
    assert steps == 11 and req.output_token_ids == list(range(100, 111))
    assert kv.pool.num_free_blocks == 16


def test_decode_step_refused_when_pool_is_empty_changes_nothing():
    kv = KVCacheManager(2, BS, enable_caching=True)
    req = Request("a", list(range(8)), SamplingParams(max_tokens=4), max_model_len=64)
    assert kv.allocate_slots(req, 8)
    blocks = list(req.block_ids)
    req.num_computed_tokens = 8
    assert not kv.allocate_slots(req, 1)  # a ninth token needs a third block
    assert req.block_ids == blocks and kv.pool.num_free_blocks == 0
    assert kv.allocate_slots(req, 0)  # nothing new: nothing needed
    assert req.block_ids == blocks
