"""Speculative decoding through the whole engine on tiny random models: with ngram drafts, every
request's tokens and log-probs are bit-identical to the same run without speculation — greedy and
seeded sampling, with penalties, bans, logit_bias, n > 1, prefix-cache hits, chunked prompts, forced
preemption, every KV cache dtype — and a request's output does not depend on what shares its steps.

Random tiny models fall into loops quickly, so prompt lookup finds drafts that are often right and often
wrong: both paths (accepted and rejected drafts) run in every test, which each test checks."""

from __future__ import annotations

import random

import pytest
import tiny_models
from ernie_archs import DENSE, OVERRIDES

from fdcli_engine import LLM, SamplingParams

# disable_by_batch_size: drafts at every batch size here (the default budget stops them from 8
# running requests), so the batched tests verify drafts.
NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_min": 1,
    "prompt_lookup_max": 3,
    "disable_by_batch_size": 64,
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    cache = {}

    def build(arch):
        if arch not in cache:
            folder = tmp_path_factory.mktemp(arch.lower())
            tiny_models.make_tiny_checkpoint(arch, folder, **OVERRIDES.get(arch, {}))
            tiny_models.write_tiny_tokenizer(folder)
            cache[arch] = folder
        return cache[arch]

    return build


def prompts_of(n, seed, lo=4, hi=40, vocab=300, shared=0):
    rng = random.Random(seed)
    prefix = [rng.randrange(3, vocab) for _ in range(shared)]
    return [prefix + [rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def run(folder, prompts, params, spec=None, **options):
    options = {"max_model_len": 160, "block_size": 8, "num_kv_blocks": 256, **options}
    llm = LLM(str(folder), speculative_config=spec, **options)
    outs = llm.generate(prompts, params)
    got = [
        [
            (c.token_ids, [lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs or [])], c.finish_reason)
            for c in o.outputs
        ]
        for o in outs
    ]
    return got, llm.get_stats()


def assert_identical(folder, prompts, params, **options):
    plain, _ = run(folder, prompts, params, **options)
    spec, stats = run(folder, prompts, params, spec=NGRAM, **options)
    changed = [i for i, (a, b) in enumerate(zip(plain, spec)) if a != b]
    assert not changed, f"{len(changed)} of {len(prompts)} outputs changed by speculation, first {changed[0]}"
    drafted = stats["spec_decode_num_draft_tokens_total"]
    accepted = stats["spec_decode_num_accepted_tokens_total"]
    assert 0 < accepted < drafted, stats  # both accepted and rejected drafts were verified
    return stats


GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, logprobs=1)


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", DENSE])
def test_greedy_identical(checkpoint, arch):
    assert_identical(checkpoint(arch), prompts_of(8, seed=1), GREEDY)


def test_greedy_matches_transformers(checkpoint):
    folder = checkpoint("LlamaForCausalLM")
    prompts = prompts_of(2, seed=3)
    got, _ = run(folder, prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), spec=NGRAM)
    hf = tiny_models.load_hf_model(folder)
    assert [g[0][0] for g in got] == [tiny_models.hf_greedy(hf, p, 24) for p in prompts]


def test_seeded_sampling_identical(checkpoint):
    params = [
        SamplingParams(temperature=0.9, top_p=0.9, seed=11, max_tokens=40, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=1.0, top_k=5, seed=12, max_tokens=40, repetition_penalty=1.3, logprobs=0),
        SamplingParams(temperature=0.7, seed=13, max_tokens=40, presence_penalty=0.5, frequency_penalty=0.4),
        SamplingParams(temperature=0.8, seed=14, max_tokens=40, min_tokens=30, n=2, logit_bias={7: 3.0}),
        SamplingParams(temperature=0, max_tokens=40, bad_words_token_ids=[[50, 60]], min_p=0.05),
    ]
    folder = checkpoint("Qwen2ForCausalLM")
    prompts = prompts_of(len(params), seed=5)
    plain = [run(folder, [p], sp)[0] for p, sp in zip(prompts, params)]
    spec = [run(folder, [p], sp, spec=NGRAM)[0] for p, sp in zip(prompts, params)]
    assert plain == spec


@pytest.mark.parametrize(
    "options",
    [
        dict(max_num_batched_tokens=24),  # chunked prompts beside drafting requests
        dict(num_kv_blocks=40, enable_prefix_caching=False),  # forced preemption
        dict(kv_cache_dtype="int8"),
        dict(kv_cache_dtype="bfloat16"),
    ],
    ids=["chunked", "preempted", "int8-kv", "bf16-kv"],
)
def test_identical_with_engine_features(checkpoint, options):
    folder = checkpoint("LlamaForCausalLM")
    stats = assert_identical(folder, prompts_of(16, seed=7, lo=20, hi=60), GREEDY, **options)
    if options.get("num_kv_blocks") == 40:
        assert stats["num_preemptions"] > 0


def test_identical_with_prefix_cache_hits(checkpoint):
    folder = checkpoint("Qwen3ForCausalLM")
    prompts = prompts_of(6, seed=9, shared=33)
    stats = assert_identical(folder, prompts + prompts, GREEDY)
    assert stats["prefix_cache_hits"] > 0


def test_batch_invariance(checkpoint):
    """One request alone and in a batch of others (drafting, prefilling, plain) gets the same tokens."""
    folder = checkpoint("LlamaForCausalLM")
    prompts = prompts_of(9, seed=13)
    alone, _ = run(folder, prompts[:1], GREEDY, spec=NGRAM)
    others = [GREEDY] + [SamplingParams(temperature=0.8, seed=i, max_tokens=30) for i in range(8)]
    batched, _ = run(folder, prompts, others, spec=NGRAM, max_num_batched_tokens=32)
    assert batched[0] == alone[0]


def test_stop_strings_and_max_tokens(checkpoint):
    folder = checkpoint("LlamaForCausalLM")
    prompts = prompts_of(6, seed=17)
    llm = LLM(str(folder), max_model_len=160, block_size=8, num_kv_blocks=256)
    texts = [o.outputs[0].text for o in llm.generate(prompts, GREEDY)]
    del llm
    for p, text in zip(prompts, texts):
        stop = text[len(text) // 3 : len(text) // 3 + 3]
        params = [
            SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=[stop]),
            SamplingParams(temperature=0, max_tokens=7),
        ]
        for sp in params:
            want = LLM(str(folder), max_model_len=160, block_size=8).generate([p], sp)[0].outputs[0]
            got = (
                LLM(str(folder), max_model_len=160, block_size=8, speculative_config=NGRAM)
                .generate([p], sp)[0]
                .outputs[0]
            )
            assert (got.text, got.token_ids, got.finish_reason) == (
                want.text,
                want.token_ids,
                want.finish_reason,
            )
            assert len(got.token_ids) <= sp.max_tokens
