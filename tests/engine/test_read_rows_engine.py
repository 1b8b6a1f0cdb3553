"""The last layer for the read rows only (runner/read_rows.py) on the whole engine: the same greedy
tokens and the same sampled logprobs (bits of the sampled rows' logits) as with every row computed,
through chunked prefill and mixed prefill + decode steps; a prompt alone or batched gives the same
tokens; a step with prompt logprobs computes every row and gives the prompt logprobs it gave before."""

from __future__ import annotations

import pytest
from ops_backend import switched_ops
from test_engine_e2e import prompts_of

from fdcli_engine import LLM, SamplingParams
from fdcli_engine.runner import read_rows


@pytest.fixture(autouse=True)
def native_ops():
    yield from switched_ops("native")


@pytest.fixture
def reduced_steps(monkeypatch):
    """Counts the steps whose model ran its last layer on a subset of the rows."""
    seen = []
    real = read_rows.out_metadata

    def spy(meta, read, *stage):
        out = real(meta, read, *stage)
        seen.append(out.out is not None)
        return out

    monkeypatch.setattr(read_rows, "out_metadata", spy)
    return seen


def make_llm(folder, quantization):
    # 32-token steps: the 20-60 token prompts are prefilled in chunks, next to other requests' decodes.
    # (The prefix cache would compute a repeated prompt in other chunks: other kS8 paths below 8 rows.)
    return LLM(
        str(folder),
        max_model_len=128,
        block_size=8,
        num_kv_blocks=96,
        max_num_batched_tokens=32,
        quantization=quantization,
        kv_cache_dtype="bfloat16",
        enable_prefix_caching=False,  # every run computes every prompt row, chunked alike
    )


def run(llm, prompts, params):
    return [
        (o.outputs[0].token_ids, o.outputs[0].logprobs, o.prompt_logprobs)
        for o in llm.generate(prompts, params)
    ]


@pytest.mark.parametrize("quantization", [None, "wint8", "wint4"])
def test_read_rows_give_the_tokens_and_logprobs_of_every_row(
    tiny_model_dir, quantization, reduced_steps, monkeypatch
):
    llm = make_llm(tiny_model_dir("Qwen3ForCausalLM"), quantization)
    prompts = prompts_of(5, seed=11, lo=20, hi=60)
    params = SamplingParams(temperature=0, max_tokens=6, logprobs=2, ignore_eos=True)
    reduced = run(llm, prompts, params)
    assert any(reduced_steps), "no step ran on the read rows alone"
    alone = [run(llm, [p], params)[0] for p in prompts]
    monkeypatch.setattr(read_rows, "rows_read", lambda *a: None)
    reduced_steps.clear()
    full = run(llm, prompts, params)
    assert not any(reduced_steps)
    assert [r[0] for r in reduced] == [f[0] for f in full]
    assert [r[1] for r in reduced] == [f[1] for f in full]  # logprob floats: the logits' bits
    assert [a[0] for a in alone] == [r[0] for r in reduced]  # batch invariance


def test_prompt_logprobs_take_every_row(tiny_model_dir, reduced_steps):
    llm = make_llm(tiny_model_dir("LlamaForCausalLM"), "wint8")
    prompts = prompts_of(3, seed=12, lo=20, hi=50)
    params = SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=2, ignore_eos=True)
    got = run(llm, prompts, params)
    # Every prompt chunk's step computed every row (the decode steps read every row anyway).
    assert reduced_steps and not any(reduced_steps)
    assert all(len(g[2]) == len(p) for g, p in zip(got, prompts, strict=True))
    # The same tokens as without prompt logprobs, where the prompt steps run on the read rows.
    reduced_steps.clear()
    plain = run(llm, prompts, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    assert any(reduced_steps)
    assert [p[0] for p in plain] == [g[0] for g in got]
