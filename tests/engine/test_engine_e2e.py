"""The whole engine (scheduler, paged KV cache, runner, sampler) on tiny random models.

Oracles: transformers' greedy generation for the same checkpoint, and each request run alone.
"""

from __future__ import annotations

import random

import pytest
import tiny_models

from fdcli_engine import LLM, SamplingParams
from fdcli_engine.errors import ConfigError, InvalidRequestError

GREEDY32 = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


def prompts_of(n, seed=0, vocab=300, lo=3, hi=40, shared=0):
    rng = random.Random(seed)
    prefix = [rng.randrange(3, vocab) for _ in range(shared)]
    return [prefix + [rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def token_lists(outs):
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("arch", tiny_models.ARCHITECTURES)
def test_greedy_matches_transformers(tiny_model_dir, arch):

    folder = tiny_model_dir(arch)
    hf = tiny_models.load_hf_model(folder)
    prompts = prompts_of(3, seed=1)
    llm = LLM(str(folder), max_model_len=128, block_size=8, num_kv_blocks=64)
    outs = llm.generate(prompts, GREEDY32)
    for p, o in zip(prompts, outs):
        assert o.outputs[0].token_ids == tiny_models.hf_greedy(hf, p, 32)
        assert o.outputs[0].finish_reason == "length"


@pytest.fixture(scope="module")
def solo_reference(tiny_model_dir):
    """Greedy outputs of 16 mixed-length prompts, each run alone."""
    folder = tiny_model_dir("LlamaForCausalLM")
    prompts = prompts_of(16, seed=2, shared=12)
    llm = LLM(str(folder), max_model_len=128, block_size=4, max_num_seqs=1, enable_prefix_caching=False)
    solo = [token_lists(llm.generate([p], GREEDY32))[0] for p in prompts]
    return folder, prompts, solo


@pytest.mark.parametrize(
    "options",
    [
        dict(enable_prefix_caching=True),
        dict(enable_prefix_caching=False),
        dict(max_num_batched_tokens=24),  # prompts up to 52 tokens: several prefill chunks each
    ],
    ids=["prefix-cache", "no-prefix-cache", "chunked"],
)
def test_batched_equals_solo(solo_reference, options):
    folder, prompts, solo = solo_reference
    llm = LLM(str(folder), max_model_len=128, block_size=4, max_num_seqs=16, **options)
    assert token_lists(llm.generate(prompts, GREEDY32)) == solo
    if options.get("enable_prefix_caching"):
        assert llm.get_stats()["prefix_cache_hits"] > 0


def test_preemption_loses_nothing(solo_reference):
    folder, prompts, solo = solo_reference
    # 40 blocks of 4 tokens hold 160 tokens; 16 requests of up to 84 tokens need far more.
    llm = LLM(str(folder), max_model_len=128, block_size=4, max_num_seqs=16, num_kv_blocks=40)
    assert token_lists(llm.generate(prompts, GREEDY32)) == solo
    assert llm.get_stats()["num_preemptions"] > 0


def test_seeded_sampling_reproducible_across_batches(tiny_model_dir):
    folder = tiny_model_dir("Qwen2ForCausalLM")
    llm = LLM(str(folder), max_model_len=128, block_size=4)
    target = prompts_of(1, seed=9)[0]
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=42, max_tokens=20, ignore_eos=True)
    alone = token_lists(llm.generate([target], params))[0]
    others = prompts_of(7, seed=10)
    mixed = llm.generate(
        others[:3] + [target] + others[3:],
        [SamplingParams(temperature=0.8, max_tokens=15, ignore_eos=True)] * 3
        + [params]
        + [SamplingParams(temperature=1.0, seed=7, max_tokens=25, ignore_eos=True)] * 4,
    )
    assert mixed[3].outputs[0].token_ids == alone
    unseeded = SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True)
    assert len({tuple(token_lists(llm.generate([target], unseeded))[0]) for _ in range(3)}) > 1


def test_n_samples_and_logprobs(tiny_model_dir):
    folder = tiny_model_dir("LlamaForCausalLM")
    llm = LLM(str(folder), max_model_len=128)
    [out] = llm.generate([[5, 6, 7]], SamplingParams(n=3, temperature=1.0, seed=1, max_tokens=8, logprobs=2))
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1
    for c in out.outputs:
        assert len(c.logprobs) == len(c.token_ids) == 8
        for tok, entry in zip(c.token_ids, c.logprobs):
            first = next(iter(entry))
            assert first == tok and len(entry) in (2, 3)
            assert all(lp.logprob <= 0 for lp in entry.values())


def test_text_prompt_and_stop_string(tiny_model_dir):
    folder = tiny_model_dir("LlamaForCausalLM")
    llm = LLM(str(folder), max_model_len=128)
    [full] = llm.generate(
        "the quick brown fox", SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    )
    text = full.outputs[0].text
    assert text and full.prompt == "the quick brown fox"
    stop = text[5:8]
    [cut] = llm.generate("the quick brown fox", SamplingParams(temperature=0, max_tokens=20, stop=[stop]))
    assert cut.outputs[0].text == text[: text.index(stop)]
    assert cut.outputs[0].finish_reason == "stop" and cut.outputs[0].stop_reason == stop
    assert not llm.engine.has_unfinished_requests()
    assert llm.get_stats()["kv_cache_usage"] == 0.0


def test_chat_uses_template(tiny_model_dir):
    folder = tiny_model_dir("LlamaForCausalLM")
    llm = LLM(str(folder), max_model_len=128)
    [out] = llm.chat([{"role": "user", "content": "hi"}], SamplingParams(temperature=0, max_tokens=4))
    assert out.prompt.startswith("<|im_start|>user")
    assert out.prompt_token_ids[0] == 1  # <|im_start|>


def test_bad_requests_and_configs(tiny_model_dir):
    folder = tiny_model_dir("LlamaForCausalLM")
    llm = LLM(str(folder), max_model_len=64)
    with pytest.raises(InvalidRequestError, match="maximum context length is 64"):
        llm.generate([[5] * 64], SamplingParams(max_tokens=1))
    with pytest.raises(InvalidRequestError, match="requested"):
        llm.generate([[5] * 60], SamplingParams(max_tokens=10))
    with pytest.raises(InvalidRequestError, match="out of range"):
        llm.generate([[5, 100000]], SamplingParams(max_tokens=1))
    with pytest.raises(InvalidRequestError):
        SamplingParams(n=0)
    with pytest.raises(ConfigError, match="exceeds the model's limit"):
        LLM(str(folder), max_model_len=100000)
    with pytest.raises(ConfigError, match="KV cache holds"):
        LLM(str(folder), max_model_len=128, num_kv_blocks=4, block_size=16)
    with pytest.raises(ConfigError, match="unknown engine option"):
        LLM(str(folder), max_model_lenn=3)
    with pytest.raises(ConfigError, match="does not exist"):
        LLM("/nonexistent/model")
