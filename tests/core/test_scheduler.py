"""Scheduler + KV cache manager against a fake runner that reads its "K/V" back through the block
tables: a wrong block table, a wrongly shared prefix block, a lost or repeated token all change the
generated tokens."""

import hashlib
import random

import pytest

from fdcli_engine.core.kv_cache_manager import KVCacheManager
from fdcli_engine.core.scheduler import Scheduler
from fdcli_engine.request import Request
from fdcli_engine.sampling_params import SamplingParams
from fdcli_engine.step_types import ModelRunnerOutput

VOCAB = 50


def next_token(prefix) -> int:
    return hashlib.sha256(str(list(prefix)).encode()).digest()[0] % VOCAB


def reference(prompt, n):
    seq = list(prompt)
    for _ in range(n):
        seq.append(next_token(seq))
    return seq[len(prompt) :]


class FakeRunner:
    def __init__(self, block_size):
        self.bs = block_size
        self.slots: dict[int, int] = {}

    def slot(self, block_ids, pos):
        return block_ids[pos // self.bs] * self.bs + pos % self.bs

    def execute(self, so):
        out = ModelRunnerOutput(sampled_token_ids={})
        for sr in so.scheduled:
            for j, t in enumerate(sr.token_ids):
                self.slots[self.slot(sr.block_ids, sr.num_computed_tokens + j)] = t
            if sr.do_sample:
                end = sr.num_computed_tokens + len(sr.token_ids)
                prefix = [self.slots[self.slot(sr.block_ids, p)] for p in range(end)]
                out.sampled_token_ids[sr.req_id] = [next_token(prefix)]
        return out


def run(prompts, max_tokens, num_blocks=64, block_size=4, budget=32, max_seqs=8, caching=True, chunked=True):
    kv = KVCacheManager(num_blocks, block_size, enable_caching=caching)
    sched = Scheduler(kv, max_seqs, budget, max_model_len=256, enable_chunked_prefill=chunked)
    runner = FakeRunner(block_size)
    for i, p in enumerate(prompts):
        sched.add_request(Request(f"r{i}", p, SamplingParams(max_tokens=max_tokens), max_model_len=256))
    results: dict[str, list[int]] = {}
    finished_count: dict[str, int] = {}
    steps = 0
    while sched.has_unfinished_requests():
        so = sched.schedule()
        assert so.num_scheduled_tokens <= budget
        assert len(sched.running) <= max_seqs
        assert len({s.req_id for s in so.scheduled}) == len(so.scheduled)
        for o in sched.update_from_output(so, runner.execute(so)):
            results.setdefault(o.req_id, []).extend(o.new_token_ids)
            if o.finish_reason:
                finished_count[o.req_id] = finished_count.get(o.req_id, 0) + 1
        steps += 1
        assert steps < 10_000
    assert all(v == 1 for v in finished_count.values()) and len(finished_count) == len(prompts)
    assert kv.num_free_blocks == num_blocks  # everything returned
    return [results[f"r{i}"] for i in range(len(prompts))], sched


def make_prompts(n, seed=0, shared_prefix=0):
    rng = random.Random(seed)
    prefix = [rng.randrange(VOCAB) for _ in range(shared_prefix)]
    return [prefix + [rng.randrange(VOCAB) for _ in range(rng.randint(1, 30))] for _ in range(n)]


@pytest.mark.parametrize("caching", [True, False])
@pytest.mark.parametrize("budget", [4, 7, 64])
def test_batched_equals_reference(caching, budget):
    prompts = make_prompts(16, shared_prefix=9)
    outs, _ = run(prompts, 12, budget=budget, caching=caching)
    assert outs == [reference(p, 12) for p in prompts]


def test_tiny_pool_preempts_and_loses_nothing():
    prompts = make_prompts(16, seed=3, shared_prefix=5)
    outs, sched = run(prompts, 20, num_blocks=24, block_size=4, budget=48, max_seqs=16)
    assert sched.num_preemptions > 0
    assert outs == [reference(p, 20) for p in prompts]


def test_prefix_cache_hits_are_counted():
    prompts = make_prompts(4, seed=5, shared_prefix=16)
    _, sched = run(prompts, 2, budget=256, max_seqs=1)
    st = sched.get_stats()
    # Requests run one at a time (max_seqs=1): each later one hits the 16-token shared prefix.
    assert st["prefix_cache_hits"] >= 3 * 16
    assert st["prefix_cache_queries"] == sum(len(p) for p in prompts)


def test_no_chunking_waits_for_whole_prompt():
    prompts = [[1] * 20, [2] * 3]
    kv = KVCacheManager(64, 4)
    sched = Scheduler(kv, 8, 24, max_model_len=256, enable_chunked_prefill=False)
    for i, p in enumerate(prompts):
        sched.add_request(Request(f"r{i}", p, SamplingParams(max_tokens=2), max_model_len=256))
    so = sched.schedule()
    # 20 + 3 fit in 24; with budget 24 both go; the first never splits.
    assert [len(s.token_ids) for s in so.scheduled] == [20, 3]
    kv2 = KVCacheManager(64, 4)
    sched2 = Scheduler(kv2, 8, 21, max_model_len=256, enable_chunked_prefill=False)
    for i, p in enumerate(prompts):
        sched2.add_request(Request(f"r{i}", p, SamplingParams(max_tokens=2), max_model_len=256))
    assert [len(s.token_ids) for s in sched2.schedule().scheduled] == [20]


def test_chunked_prefill_splits_and_samples_only_at_end():
    kv = KVCacheManager(64, 4)
    sched = Scheduler(kv, 8, 8, max_model_len=256)
    sched.add_request(Request("a", list(range(20)), SamplingParams(max_tokens=1), max_model_len=256))
    runner = FakeRunner(4)
    chunks = []
    while sched.has_unfinished_requests():
        so = sched.schedule()
        chunks.append([(len(s.token_ids), s.do_sample) for s in so.scheduled])
        sched.update_from_output(so, runner.execute(so))
    assert chunks == [[(8, False)], [(8, False)], [(4, True)]]


def test_abort_frees_blocks_and_reports():
    kv = KVCacheManager(16, 4)
    sched = Scheduler(kv, 8, 64, max_model_len=256)
    sched.add_request(Request("a", list(range(10)), SamplingParams(max_tokens=50), max_model_len=256))
    so = sched.schedule()
    sched.update_from_output(so, FakeRunner(4).execute(so))
    assert kv.num_free_blocks < 16
    [o] = sched.abort_requests(["a", "unknown"])
    assert o.finish_reason == "abort"
    assert kv.num_free_blocks == 16 and not sched.has_unfinished_requests()
    assert "a" in sched.schedule().finished_req_ids


def test_stop_conditions():
    kv = KVCacheManager(16, 4)
    sched = Scheduler(kv, 8, 64, max_model_len=256, eos_token_ids={7})
    mk = lambda rid, **kw: Request(rid, [1, 2], SamplingParams(**kw), max_model_len=256)  # noqa: E731
    sched.add_request(mk("eos", max_tokens=10))
    sched.add_request(mk("ign", max_tokens=3, ignore_eos=True))
    sched.add_request(mk("stopid", max_tokens=10, stop_token_ids=[9]))
    sched.add_request(mk("min", max_tokens=10, min_tokens=2))
    feed = {"eos": [7], "ign": [7, 7, 7], "stopid": [9], "min": [7, 7, 7]}
    finished = {}
    counts = {}
    while sched.has_unfinished_requests():
        so = sched.schedule()
        out = ModelRunnerOutput(sampled_token_ids={s.req_id: [feed[s.req_id].pop(0)] for s in so.scheduled})
        for o in sched.update_from_output(so, out):
            counts[o.req_id] = counts.get(o.req_id, 0) + len(o.new_token_ids)
            if o.finish_reason:
                finished[o.req_id] = (o.finish_reason, o.stop_reason)
    assert counts == {"eos": 1, "ign": 3, "stopid": 1, "min": 3}
    assert finished == {
        "eos": ("stop", None),
        "ign": ("length", None),
        "stopid": ("stop", 9),
        "min": ("stop", None),
    }


def test_events_as_vllms_with_preemption():
    """vLLM's per-request events (vllm/v1/core/sched/scheduler.py): QUEUED once when added, SCHEDULED at
    each admission from the waiting queue, PREEMPTED at each preemption, each handed out once with the
    request's next output; an output's timestamp (its step's end) is never before its events."""
    from fdcli_engine.outputs import EngineCoreEventType as T

    kv = KVCacheManager(24, 4)
    sched = Scheduler(kv, 16, 48, max_model_len=256)
    prompts = make_prompts(16, seed=3, shared_prefix=5)
    for i, p in enumerate(prompts):
        sched.add_request(Request(f"r{i}", p, SamplingParams(max_tokens=20), max_model_len=256))
    runner = FakeRunner(4)
    events: dict[str, list] = {f"r{i}": [] for i in range(len(prompts))}
    last_ts = 0.0
    while sched.has_unfinished_requests():
        so = sched.schedule()
        outs = sched.update_from_output(so, runner.execute(so))
        assert len({o.timestamp for o in outs}) <= 1  # one time per step
        for o in outs:
            assert o.timestamp >= last_ts
            assert all(e.timestamp <= o.timestamp for e in o.events or ())
            events[o.req_id] += o.events or []
        last_ts = max([last_ts] + [o.timestamp for o in outs])
    assert sched.num_preemptions > 0
    num_preempted = 0
    for evs in events.values():
        kinds = [e.type for e in evs]
        assert kinds[:2] == [T.QUEUED, T.SCHEDULED]
        # After the first admission: each preemption, then the re-admission that follows it.
        assert kinds[2:] == [T.PREEMPTED, T.SCHEDULED] * (len(kinds[2:]) // 2)
        assert [e.timestamp for e in evs] == sorted(e.timestamp for e in evs)
        num_preempted += kinds.count(T.PREEMPTED)
    assert num_preempted == sched.num_preemptions


def test_abort_hands_out_pending_events():
    """A request aborted while waiting still reports that it was queued (and never scheduled)."""
    from fdcli_engine.outputs import EngineCoreEventType as T

    sched = Scheduler(KVCacheManager(16, 4), 8, 64, max_model_len=256)
    sched.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=5), max_model_len=256))
    [out] = sched.abort_requests(["a"])
    assert out.finish_reason == "abort"
    assert [e.type for e in out.events] == [T.QUEUED]


def test_prompt_sources_and_step_tokens_add_up_through_preemption_and_chunks():
    """vLLM's prompt-token sources and tokens per step (core/token_stats.py) count each prompt once,
    when first admitted, through chunked prefill and preemption: the sources minus the recomputed tokens
    are the prompt tokens, and the steps' tokens are the prompt plus the generated tokens."""
    prompts = make_prompts(16, seed=3, shared_prefix=5)
    outs, sched = run(prompts, 20, num_blocks=24, block_size=4, budget=16, max_seqs=16)
    st = sched.get_stats()
    assert sched.num_preemptions > 0
    sources = (
        "prompt_tokens_local_compute",
        "prompt_tokens_local_cache_hit",
        "prompt_tokens_external_kv_transfer",
    )
    assert sum(st[k] for k in sources) - st["prompt_tokens_recomputed"] == sum(len(p) for p in prompts)
    assert st["prompt_tokens_total"] == sum(len(p) for p in prompts)
    assert st["iteration_tokens_sum"] == st["prompt_tokens_total"] + st["generation_tokens_total"]
    assert st["generation_tokens_total"] == sum(len(o) for o in outs)
    assert sum(st["iteration_tokens_buckets"]) == st["iteration_tokens_count"]
    # vLLM's prefix-cache counters look up each request once: re-admissions after preemption are left out.
    assert st["prefix_cache_queries"] == sum(len(p) for p in prompts)


@pytest.mark.parametrize("extra", [0, 1, 3])
def test_recomputed_tokens_are_the_last_block_of_a_wholly_cached_prompt(extra):
    """The second run of a prompt: every whole block is cached, but one token must be computed, so a
    prompt of whole blocks computes its last cached block again (vLLM's prompt_tokens_recomputed); one
    with a partial last block reuses every cached block and recomputes nothing."""
    prompt = make_prompts(1, seed=9, shared_prefix=16)[0][:16] + list(range(extra))
    _, sched = run([prompt, prompt], 2, block_size=4, max_seqs=1)
    st = sched.get_stats()
    recomputed = 4 if extra == 0 else 0  # the 16 tokens are 4 whole blocks; the extra ones a partial one
    assert st["prefix_cache_hits"] == 16 - recomputed
    assert st["prompt_tokens_recomputed"] == recomputed
    assert st["prompt_tokens_local_cache_hit"] == 16
    assert st["prompt_tokens_cached"] == st["prefix_cache_hits"]
