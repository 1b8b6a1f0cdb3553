"""draft_model and mtp through the engine (`LLM(..., speculative_config=...)`): greedy outputs are
token-identical to the same LLM without speculation, with prompts longer than the step budget
(chunked), a second round hitting the prefix cache, and a KV pool tight enough to preempt. The target
as its own draft has every draft accepted (the engine's spec_decode counters); another draft, or ERNIE's
random MTP head, changes no token while most drafts are rejected."""

from __future__ import annotations

import numpy as np
import pytest
from tiny_models import make_tiny_checkpoint, make_tiny_ernie_mtp, write_tiny_tokenizer

from fdcli_engine import LLM, SamplingParams

MAX_TOKENS = 12
OPTIONS = dict(max_model_len=128, block_size=4, max_num_batched_tokens=16, max_num_seqs=8)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("spec-engine")
    target = make_tiny_checkpoint("LlamaForCausalLM", root / "target")
    write_tiny_tokenizer(target)
    return {
        "target": target,
        "small": make_tiny_checkpoint("LlamaForCausalLM", root / "small", seed=3, num_hidden_layers=1),
        "ernie": make_tiny_ernie_mtp(root / "ernie"),
    }


def prompts(seed: int, n: int = 6) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 500, size=int(rng.integers(4, 40))).tolist() for _ in range(n)]


def generate(llm: LLM, batch: list[list[int]], max_tokens: int = MAX_TOKENS) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(batch, params)]


def run(model, spec=None, **options) -> tuple[list[list[int]], dict]:
    """Two rounds: the prompts, then the same prompts each with a new tail (prefix-cache hits)."""
    llm = LLM(str(model), speculative_config=spec, **{**OPTIONS, **options})
    first = prompts(0)
    second = [p + [7, 8, 9] for p in first]
    outs = generate(llm, first) + generate(llm, second)
    return outs, llm.get_stats()


def run_preempting(model, spec=None, num_kv_blocks=None) -> tuple[list[list[int]], dict]:
    """16 requests of up to 80 tokens; 32 blocks of 4 tokens hold about three of them."""
    options = {**OPTIONS, "enable_prefix_caching": False}
    llm = LLM(str(model), speculative_config=spec, num_kv_blocks=num_kv_blocks, **options)
    return generate(llm, prompts(1, n=16), max_tokens=40), llm.get_stats()


@pytest.fixture(scope="module")
def plain(folders):
    return {name: run(folders[name])[0] for name in ("target", "ernie")}


def spec_of(method: str, model=None, k: int = 3) -> dict:
    spec = {"method": method, "num_speculative_tokens": k}
    return {**spec, "model": str(model)} if model else spec


def test_target_as_its_own_draft(folders, plain):
    outs, stats = run(folders["target"], spec_of("draft_model", folders["target"]))
    assert outs == plain["target"]
    assert stats["spec_decode_num_draft_tokens_total"] > 50
    assert stats["spec_decode_num_accepted_tokens_total"] == stats["spec_decode_num_draft_tokens_total"]
    assert stats["prefix_cache_hits"] > 0


def test_another_draft_model(folders, plain):
    outs, stats = run(folders["target"], spec_of("draft_model", folders["small"]))
    assert outs == plain["target"]
    assert 0 < stats["spec_decode_num_draft_tokens_total"]
    assert stats["spec_decode_num_accepted_tokens_total"] < stats["spec_decode_num_draft_tokens_total"] / 2


def test_random_mtp_head(folders, plain):
    outs, stats = run(folders["ernie"], spec_of("mtp", k=2))
    assert outs == plain["ernie"]
    assert 0 < stats["spec_decode_num_draft_tokens_total"]
    assert stats["spec_decode_num_accepted_tokens_total"] <= stats["spec_decode_num_draft_tokens_total"] // 10


@pytest.mark.parametrize("method", ["draft_model", "mtp"])
def test_preemption(folders, method):
    name = "target" if method == "draft_model" else "ernie"
    spec = spec_of(method, folders["target"] if method == "draft_model" else None)
    expected, stats = run_preempting(folders[name])
    assert stats["num_preemptions"] == 0
    outs, stats = run_preempting(folders[name], spec, num_kv_blocks=32)
    assert stats["num_preemptions"] > 5
    assert outs == expected
    if method == "draft_model":
        assert stats["spec_decode_num_accepted_tokens_total"] == stats["spec_decode_num_draft_tokens_total"]


@pytest.mark.parametrize("kv_cache_dtype", ["bfloat16", "int8"])
def test_own_draft_with_a_smaller_kv_cache(folders, kv_cache_dtype):
    # The draft's cache takes the target's dtype: int8 codes and scales are per token, so the draft's
    # K/V (the target's own, here) round the same way and every draft is still accepted.
    plain, _ = run(folders["target"], kv_cache_dtype=kv_cache_dtype)
    spec = spec_of("draft_model", folders["target"])
    outs, stats = run(folders["target"], spec, kv_cache_dtype=kv_cache_dtype)
    assert outs == plain
    assert stats["spec_decode_num_accepted_tokens_total"] == stats["spec_decode_num_draft_tokens_total"] > 50


@pytest.mark.parametrize("method", ["draft_model", "mtp"])
def test_seeded_sampling_is_unchanged(folders, method):
    # Model drafts are point proposals (argmax tokens), so a seeded request's tokens are its plain ones.
    name = "target" if method == "draft_model" else "ernie"
    spec = spec_of(method, folders["small"] if method == "draft_model" else None)
    params = [SamplingParams(temperature=0.8, top_p=0.9, seed=s, max_tokens=16) for s in range(4)]
    batch = prompts(2, n=4)

    def sample(spec):
        llm = LLM(str(folders[name]), speculative_config=spec, **OPTIONS)
        return [o.outputs[0].token_ids for o in llm.generate(batch, params)], llm.get_stats()

    plain, _ = sample(None)
    outs, stats = sample(spec)
    assert outs == plain
    assert stats["spec_decode_num_draft_tokens_total"] > 0
