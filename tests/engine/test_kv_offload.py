"""The KV offload tiers in the engine (docs/kv-offload.md), on tiny checkpoints with a small pool.

Oracle: the same engine without a tier. A raw tier restores the very bits the pool held, so greedy tokens
and their logprobs must be identical (test_kv_connector.py shows a restored block's outputs are
bit-identical to a computed one's); every test also asserts the tier was really used.
"""

from __future__ import annotations

import os

import pytest
from test_engine_e2e import prompts_of
from test_kv_connector import outputs

from fdcli_engine import LLM, SamplingParams
from fdcli_engine.kv_transfer.offload.file_tier import HEADER

BS = 4
GiB = 1 << 30
BLOCK = 2048  # bytes of one tiny-Llama block of 4 tokens (2 layers, K and V, fp32)
PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=3)
PROMPTS = prompts_of(3, seed=11, lo=20, hi=26)  # each prompt + answer fills most of a 12-block pool


def engine(folder, **options):
    base = dict(max_model_len=48, block_size=BS, num_kv_blocks=12, max_num_seqs=1)
    return LLM(str(folder), **(base | options))


def passes(llm, n=2, prompts=PROMPTS):
    return [outputs(llm.generate(prompts, PARAMS)) for _ in range(n)]


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    folder = tiny_model_dir("LlamaForCausalLM")
    return folder, passes(engine(folder))


def test_evicted_blocks_come_back_from_memory(reference):
    folder, want = reference
    cap = 10 * BLOCK
    llm = engine(folder, swap_space=cap / GiB)
    got = [outputs(llm.generate(PROMPTS, PARAMS))]
    tier = llm.engine.kv_connector.memory
    assert len(tier) == 10 and tier.nbytes == cap  # evictions filled the tier to its bound
    got += [outputs(llm.generate(PROMPTS, PARAMS))]
    assert tier.nbytes <= cap
    assert got == want
    s = llm.get_stats()
    assert s["kv_offload_hit_tokens"] > 0 and s["kv_offload_bytes:CPU_to_KV"] > 0
    assert s["prefix_cpu_cache_token_num"] == len(tier) * BS
    assert llm.engine.scheduler.kv.num_free_blocks == 12


def test_preempted_request_resumes_from_memory(tiny_model_dir):
    folder = tiny_model_dir("LlamaForCausalLM")
    solo = passes(engine(folder, num_kv_blocks=64), n=1)[0]
    # Three requests of up to 34 tokens in 12 blocks of 4: preemption; without prefix caching the
    # pool keeps nothing, so a resume takes its computed blocks from the tier or recomputes them.
    llm = engine(folder, max_num_seqs=3, enable_prefix_caching=False, swap_space=64 * BLOCK / GiB)
    got = outputs(llm.generate(PROMPTS, PARAMS))
    s = llm.get_stats()
    assert s["num_preemptions"] > 0 and s["kv_offload_hit_tokens"] > 0
    assert [t for t, _ in got] == [t for t, _ in solo]


@pytest.mark.parametrize("tiers", ["dir", "swap+dir"])
def test_file_tier_survives_a_restart(reference, tiny_model_dir, tmp_path, tiers):
    folder, want = reference
    swap = dict(swap_space=2 * BLOCK / GiB) if tiers == "swap+dir" else {}
    first = engine(folder, num_kv_blocks=64, kv_offload_dir=str(tmp_path), **swap)
    assert passes(first, n=1) == want[:1]
    if swap:
        assert first.get_stats()["kv_offload_bytes:CPU_to_DISK"] == 0  # a big pool evicts nothing
    first.engine.shutdown()  # writes what is queued
    assert first.get_stats()["kv_offload_disk_cache_token_num"] > 0

    second = engine(folder, num_kv_blocks=64, kv_offload_dir=str(tmp_path), **swap)
    assert passes(second, n=1) == want[:1]
    s = second.get_stats()
    assert s["kv_offload_hit_tokens"] > 0 and s["kv_offload_bytes:DISK_to_KV"] > 0
    second.engine.shutdown()

    # Another model finds nothing of the first's in the same directory.
    qwen = tiny_model_dir("Qwen2ForCausalLM")
    want_qwen = passes(engine(qwen, num_kv_blocks=64), n=1)
    other = engine(qwen, num_kv_blocks=64, kv_offload_dir=str(tmp_path))
    assert passes(other, n=1) == want_qwen
    assert other.get_stats()["kv_offload_hit_tokens"] == 0
    other.engine.shutdown()


def test_damaged_files_are_recomputed(reference, tmp_path):
    folder, want = reference
    first = engine(folder, num_kv_blocks=64, kv_offload_dir=str(tmp_path))
    passes(first, n=1)
    first.engine.shutdown()
    files = [p for p in tmp_path.rglob("*.kv")]
    assert files
    for p in files:
        data = bytearray(p.read_bytes())
        data[len(data) // 2] ^= 0xFF
        p.write_bytes(bytes(data))
    second = engine(folder, num_kv_blocks=64, kv_offload_dir=str(tmp_path))
    assert passes(second, n=1) == want[:1]
    tier = second.engine.kv_connector.files
    assert tier.num_corrupt > 0 and second.get_stats()["kv_offload_hit_tokens"] == 0
    second.engine.shutdown()


def test_file_tier_stays_within_its_bound(reference, tmp_path):
    folder, want = reference
    cap = 5 * (BLOCK + HEADER.size)
    llm = engine(folder, kv_offload_dir=str(tmp_path), kv_offload_dir_gb=cap / GiB)
    tier = llm.engine.kv_connector.files
    got = []
    for _ in range(2):
        got.append(outputs(llm.generate(PROMPTS, PARAMS)))
        llm.engine.kv_connector.flush()
        on_disk = sum(e.stat().st_size for e in os.scandir(tier.dir))
        assert on_disk == tier.nbytes <= cap and len(tier) == 5
    assert got == want
    llm.engine.shutdown()


def test_int8_tier_stores_codes_and_restores(reference):
    folder, want = reference
    llm = engine(folder, swap_space=64 * BLOCK / GiB, kv_offload_compression="int8")
    got = passes(llm)
    conn = llm.engine.kv_connector
    assert conn.codec.nbytes < conn.views.block_nbytes
    assert conn.memory.nbytes == len(conn.memory) * conn.codec.nbytes > 0
    assert llm.get_stats()["kv_offload_hit_tokens"] > 0
    assert got[0] == want[0]  # nothing restored in the first pass
    # The second pass decodes from restored C8 blocks: its logits are checked against the C8 cache's
    # error in test_kv_offload_units.py; here the answers run to their length.
    assert [len(t) for t, _ in got[1]] == [8] * len(PROMPTS)
