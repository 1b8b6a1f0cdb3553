"""Preemption must not change answers (#28 item 5; vLLM's tests/basic_correctness/test_preemption.py).

A preempted request is recomputed: its prompt and the tokens it already generated are prefilled again
as one many-row query, while those generated tokens first came from one-row decode steps. The kernels
give a row the same bits whatever shares its step (fd_kernels: every GEMM output is one FMA chain over k
in order; a generated-token query takes its decode step's attention items), so the recomputed K/V, every
later logit and therefore every log-prob are bit-identical. The oracle is the same requests on a pool
roomy enough that nothing is preempted; the tight pool must preempt many times, for every KV cache dtype.
"""

from __future__ import annotations

import pytest
from test_engine_e2e import prompts_of

from fdcli_engine import LLM, SamplingParams

NUM_REQUESTS = 64


def _run(model, prompts, max_tokens, num_kv_blocks, **options):
    llm = LLM(model, num_kv_blocks=num_kv_blocks, enable_prefix_caching=False, **options)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=0)
    outs = []
    for o in llm.generate(prompts, params):
        c = o.outputs[0]
        # Each position's dict holds the sampled token's log-prob (logprobs=0: no alternatives).
        outs.append((c.token_ids, [lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs)]))
    return outs, llm.get_stats()["num_preemptions"]


def _assert_same(model, prompts, max_tokens, tight_blocks, min_preemptions, roomy_blocks=4096, **options):
    roomy, roomy_preemptions = _run(model, prompts, max_tokens, roomy_blocks, **options)
    tight, preemptions = _run(model, prompts, max_tokens, tight_blocks, **options)
    assert roomy_preemptions == 0
    assert preemptions >= min_preemptions, f"the tight pool preempted only {preemptions} times"
    tokens = [i for i, (a, b) in enumerate(zip(roomy, tight)) if a[0] != b[0]]
    assert not tokens, f"{len(tokens)} of {len(prompts)} greedy outputs changed by {preemptions} preemptions"
    # Bit-identical, not close: a log-prob that moved at all means some K/V or logit did.
    logprobs = [i for i, (a, b) in enumerate(zip(roomy, tight)) if a[1] != b[1]]
    assert not logprobs, f"{len(logprobs)} of {len(prompts)} requests' log-probs changed by preemption"


@pytest.mark.parametrize("kv_cache_dtype", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen3ForCausalLM"])
def test_preemption_keeps_outputs_tiny(tiny_model_dir, arch, kv_cache_dtype):
    prompts = prompts_of(NUM_REQUESTS, seed=7, lo=3, hi=60)
    options = dict(max_model_len=128, block_size=4, kv_cache_dtype=kv_cache_dtype)
    _assert_same(str(tiny_model_dir(arch)), prompts, 48, 40, 40, **options)


@pytest.mark.slow
def test_preemption_keeps_outputs_smollm2():
    # The default model on its GGUF kernels, with its default bf16 cache (the tiny models above cover
    # every cache dtype). 8 blocks of 16 tokens hold about two of these 64-token requests at a time.
    prompts = prompts_of(16, seed=3, vocab=20000, lo=8, hi=40)
    options = dict(max_model_len=64, kv_cache_dtype="bfloat16")
    _assert_same(None, prompts, 24, 8, 10, roomy_blocks=64, **options)
