"""DPRouter and the merged stats of several ranks, without engines: the rule as documented in
docs/parallel.md, against hand-counted expectations."""

from __future__ import annotations

import pytest

from fdcli_engine.api.dp_router import DPRouter
from fdcli_engine.api.dp_stats import merge_rank_stats
from fdcli_engine.request import Request
from fdcli_engine.sampling_params import SamplingParams

PROMPT = list(range(64))  # four 16-token blocks


def test_hashes_are_the_engines_rule_salt_included():
    router = DPRouter(2, 16, prefix_caching=True)
    salted = SamplingParams(cache_salt="tenant-a")
    want = Request("x", PROMPT, salted, 1024).update_block_hashes(16)
    assert router.block_hashes(PROMPT, salted) == want
    assert router.block_hashes(PROMPT, SamplingParams())[0] != want[0]
    assert DPRouter(2, 16, prefix_caching=False).block_hashes(PROMPT, salted) == []


def test_load_first_prefix_holder_within_the_slack():
    router = DPRouter(2, 16, prefix_caching=True)
    hashes = router.block_hashes(PROMPT, SamplingParams())
    assert router.pick(hashes, [0, 0]) == 0  # tie: the lower rank
    router.record(1, hashes)
    assert router.pick(hashes, [0, 0]) == 1  # rank 1 holds the whole prompt
    assert router.pick(hashes, [0, 1]) == 1  # one more request: still worth it
    assert router.pick(hashes, [0, 2]) == 0  # two more: balance wins
    assert router.pick(hashes, [None, 5]) == 1  # a dead rank gets nothing
    half = hashes[:2] + router.block_hashes(list(range(100, 132)), SamplingParams())
    assert router.matched_blocks(1, half) == 2
    router.forget(1)
    assert router.pick(hashes, [0, 0]) == 0


def test_a_shared_preamble_block_does_not_outweigh_one_request():
    # Two short chats of 33 tokens whose first 16-token block (the template's preamble) is the same: rank
    # 0 holds 16 of the second's 33 tokens, less than half, so one request of imbalance sends it to the
    # idle rank 1 (counted over full blocks only, 1 of 2, it tied and stayed on the busy rank 0).
    router = DPRouter(2, 16, prefix_caching=True)
    first, second = list(range(33)), list(range(16)) + list(range(100, 117))
    router.record(0, router.block_hashes(first, SamplingParams()))
    hashes = router.block_hashes(second, SamplingParams())
    assert router.matched_blocks(0, hashes) == 1 and len(hashes) == 2
    assert router.pick(hashes, [1, 0], num_tokens=len(second)) == 1
    # Exactly half the prompt held against one request: a tie, which goes to the less-loaded rank.
    assert router.pick(hashes, [1, 0], num_tokens=32) == 1
    assert router.pick(hashes, [0, 0], num_tokens=len(second)) == 0  # idle both: the holder


def test_lru_is_bounded():
    router = DPRouter(1, 16, prefix_caching=True, lru_blocks=3)
    hashes = router.block_hashes(PROMPT, SamplingParams())
    router.record(0, hashes)
    assert router.matched_blocks(0, hashes) == 0  # the first block fell out: the chain breaks there
    assert router.matched_blocks(0, hashes[1:]) == 3


def test_merge_sums_counters_over_all_ranks_gauges_over_live():
    a = {"num_running": 2, "kv_cache_usage": 0.5, "prompt_tokens_total": 10, "per_pos": [1, 2]}
    b = {"num_running": 1, "kv_cache_usage": 0.1, "prompt_tokens_total": 5, "per_pos": [3]}
    both = merge_rank_stats([a, b], [a, b])
    assert both["num_running"] == 3 and both["prompt_tokens_total"] == 15 and both["per_pos"] == [4, 2]
    assert abs(both["kv_cache_usage"] - 0.3) < 1e-12 and both["dead_ranks"] == []
    one_dead = merge_rank_stats([a, None], [a, b])
    assert one_dead["num_running"] == 2 and one_dead["prompt_tokens_total"] == 15
    assert one_dead["dead_ranks"] == [1] and list(one_dead["ranks"]) == ["0"]


def test_in_process_llm_refuses_data_parallel(tiny_model):
    from fdcli_engine import LLM
    from fdcli_engine.errors import ConfigError

    with pytest.raises(ConfigError, match=r"LLM\(data_parallel_size=2\): the in-process engine is one"):
        LLM(str(tiny_model), data_parallel_size=2)
