"""The KV connector's calls in the engine (kv_transfer/base.py), with a connector that keeps blocks in a
dict by hash: saved when a request ends and when the pool evicts a cached block, loaded on a later
admission after the pool's own hit.

Oracle: the same engine without a connector, whose second pass over the same prompts takes its prefix
from the pool's own cache. A block restored through the connector holds the very bits the pool would have
kept, so greedy tokens and their logprobs must be bit-identical, for every KV cache dtype, whether the
connector loads every block, none (all recomputed) or only the first.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_engine_e2e import prompts_of

from fdcli_engine import LLM, SamplingParams
from fdcli_engine.kv_transfer.base import KVConnector
from fdcli_engine.request import EngineCoreRequest

PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=3)
BS = 4


class DictConnector(KVConnector):
    """Blocks by hash. `max_load`: how many leading blocks load() writes (None: all it is asked for);
    `zeros`: write zeros instead of the saved K/V (a broken connector the oracle must catch)."""

    def __init__(self, max_load=None, zeros=False):
        self.store: dict[bytes, list[np.ndarray]] = {}
        self.max_load = max_load
        self.zeros = zeros
        self.loaded = 0
        self.evicted = 0
        self.finished = []
        self.not_ready: dict[str, int] = {}  # request id -> how many more times to answer None

    def request_finished(self, request):
        self.finished.append(request.req_id)
        hashes = request.update_block_hashes(BS)
        for i in range(request.num_computed_tokens // BS):
            self.store.setdefault(hashes[i], self.views.read(request.block_ids[i]))

    def on_evict(self, block_hash, block_id):
        self.evicted += 1
        self.store[block_hash] = self.views.read(block_id)

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        if self.not_ready.get(request.req_id, 0) > 0:
            self.not_ready[request.req_id] -= 1
            return None
        hashes = request.update_block_hashes(BS)
        n = 0
        for h in hashes[num_computed_tokens // BS :]:
            if h not in self.store:
                break
            n += 1
        return n * BS

    def load(self, request, block_hashes, block_ids):
        n = len(block_hashes) if self.max_load is None else min(self.max_load, len(block_hashes))
        for h, bid in zip(block_hashes[:n], block_ids[:n]):
            parts = self.store[h]
            self.views.write(bid, [np.zeros_like(p) for p in parts] if self.zeros else parts)
        self.loaded += n
        return n


def outputs(outs):
    return [
        (
            o.outputs[0].token_ids,
            [sorted((t, lp.logprob) for t, lp in d.items()) for d in o.outputs[0].logprobs],
        )
        for o in outs
    ]


def two_passes(folder, dtype, connector=None, prompts=None, **options):
    """Outputs of the prompts twice; between the passes the pool forgets its prefix cache when a
    connector is there to supply it instead."""
    prompts = prompts_of(4, seed=5, lo=6, hi=14, shared=9)
    llm = LLM(
        str(folder), max_model_len=128, block_size=BS, kv_cache_dtype=dtype, num_kv_blocks=64, **options
    )
    if connector is not None:
        llm.engine.bind_kv_connector(connector)
    first = outputs(llm.generate(prompts, PARAMS))
    if connector is not None:
        llm.engine.reset_prefix_cache()
        for a in connector.views.arrays:  # nothing of the first pass is left in the pool
            a[...] = 0
    return first, outputs(llm.generate(prompts, PARAMS)), llm


@pytest.fixture(scope="module", params=["float32", "bfloat16", "int8"])
def reference(request, tiny_model_dir):
    folder = tiny_model_dir("LlamaForCausalLM")
    first, second, llm = two_passes(folder, request.param)
    assert llm.get_stats()["prefix_cache_hits"] > 0
    return folder, request.param, first, second


@pytest.mark.parametrize("max_load", [None, 0, 1], ids=["all", "none", "first"])
def test_restored_blocks_give_identical_outputs(reference, max_load):
    folder, dtype, want_first, want_second = reference
    conn = DictConnector(max_load=max_load)
    first, second, llm = two_passes(folder, dtype, conn)
    assert first == want_first
    assert second == want_second
    if max_load != 0:
        assert conn.loaded > 0
    stats = llm.get_stats()
    assert stats["kv_connector_loaded_tokens"] == conn.loaded * BS
    # vLLM's prompt sources: what the connector loaded is external_kv_transfer, and cached with the hits.
    assert stats["prompt_tokens_external_kv_transfer"] == conn.loaded * BS
    assert stats["prompt_tokens_cached"] == stats["prefix_cache_hits"] + conn.loaded * BS
    # vLLM's external prefix cache hits: what the connector matched, loaded or not (max_load cuts loads).
    assert stats["external_prefix_cache_hits"] >= conn.loaded * BS
    if max_load is None:
        assert stats["external_prefix_cache_hits"] == conn.loaded * BS
    assert llm.engine.scheduler.kv.num_free_blocks == 64


def test_zeros_instead_of_the_blocks_change_the_outputs(reference):
    # The oracle above is sharp enough to catch a connector that loads the wrong K/V.
    folder, dtype, _, want_second = reference
    _, second, _ = two_passes(folder, dtype, DictConnector(zeros=True))
    assert second != want_second


def test_eviction_saves_blocks_and_small_pool_restores_them(reference):
    # 12 blocks of 4 tokens: every pass evicts the cached blocks of earlier prompts; what the pool
    # no longer has comes back from the connector.
    folder, dtype, _, want_second = reference
    conn = DictConnector()
    prompts = prompts_of(4, seed=5, lo=6, hi=14, shared=9)
    llm = LLM(str(folder), max_model_len=48, block_size=BS, kv_cache_dtype=dtype, num_kv_blocks=12)
    llm.engine.bind_kv_connector(conn)
    llm.generate(prompts, PARAMS)
    second = outputs(llm.generate(prompts, PARAMS))
    assert [t for t, _ in second] == [t for t, _ in want_second]
    assert conn.evicted > 0 and conn.loaded > 0
    assert llm.engine.scheduler.kv.num_free_blocks == 12


def core_request(rid, prompt):
    return EngineCoreRequest(rid, prompt, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))


def test_not_ready_waits_without_blocking_the_others_then_runs(tiny_model_dir):
    folder = tiny_model_dir("LlamaForCausalLM")
    a, b = prompts_of(2, seed=7, lo=9, hi=12)
    solo = LLM(str(folder), max_model_len=64, block_size=BS, num_kv_blocks=32)
    want = [
        o.outputs[0].token_ids
        for o in solo.generate([a, b], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    ]

    llm = LLM(str(folder), max_model_len=64, block_size=BS, num_kv_blocks=32)
    conn = DictConnector()
    conn.not_ready["a"] = 3
    llm.engine.bind_kv_connector(conn)
    core = llm.engine
    core.add_request(core_request("a", a))
    core.add_request(core_request("b", b))
    got: dict[str, list[int]] = {"a": [], "b": []}
    order = []
    for _ in range(40):
        if not core.has_unfinished_requests():
            break
        for out in core.step():
            got[out.req_id] += out.new_token_ids
            if out.finish_reason:
                order.append(out.req_id)
    assert [got["a"], got["b"]] == want
    assert conn.not_ready["a"] == 0
    assert order[0] == "b"  # b was admitted while a waited for its connector


def test_abort_while_waiting_leaks_nothing(tiny_model_dir, monkeypatch):
    folder = tiny_model_dir("LlamaForCausalLM")
    (a,) = prompts_of(1, seed=8, lo=9, hi=12)
    llm = LLM(str(folder), max_model_len=64, block_size=BS, num_kv_blocks=32)
    conn = DictConnector()
    conn.not_ready["a"] = 10**9
    llm.engine.bind_kv_connector(conn)
    core = llm.engine
    free0 = core.scheduler.kv.num_free_blocks
    core.add_request(core_request("a", a))
    import fdcli_engine.engine as engine_module

    naps = []
    monkeypatch.setattr(engine_module.time, "sleep", naps.append)
    for _ in range(3):
        assert core.step() == []
    assert core.scheduler.num_deferred == 1
    assert naps == [engine_module.CONNECTOR_POLL_S] * 3  # a step with only such requests polls
    outs = core.abort_requests(["a"])
    assert [o.finish_reason for o in outs] == ["abort"]
    assert not core.has_unfinished_requests()
    assert core.scheduler.kv.num_free_blocks == free0
    assert conn.finished == ["a"]


@pytest.mark.parametrize("method", ["draft_model", "mtp"])
def test_a_draft_models_caches_travel_with_the_targets(tmp_path, method):
    # Drafts never change greedy tokens, but a draft model whose K/V were not restored would propose
    # other drafts: the same acceptance counts show its caches came back too.
    from tiny_models import make_tiny_checkpoint, make_tiny_ernie_mtp, write_tiny_tokenizer

    if method == "mtp":
        folder, spec = make_tiny_ernie_mtp(tmp_path / "ernie"), {"method": "mtp", "num_speculative_tokens": 2}
    else:
        folder = make_tiny_checkpoint("LlamaForCausalLM", tmp_path / "target")
        write_tiny_tokenizer(folder)
        spec = {"method": "draft_model", "num_speculative_tokens": 2, "model": str(folder)}
    prompts = prompts_of(4, seed=5, lo=6, hi=14, shared=9)
    _, want, ref = two_passes(folder, "float32", prompts=prompts, speculative_config=spec)
    conn = DictConnector()
    _, got, llm = two_passes(folder, "float32", conn, prompts=prompts, speculative_config=spec)
    target_layers = llm.engine.runner.kv_caches
    assert len(conn.views.arrays) > 2 * len(target_layers)  # the draft's caches are in the views
    assert got == want and conn.loaded > 0
    key = "spec_decode_num_accepted_tokens_total"
    assert llm.get_stats()[key] == ref.get_stats()[key] > 0
