"""Plain greedy steps without logprobs take the LM head's fused argmax (ops.linear_argmax, or with the
native stack the same argmax at the end of the forward's op: model.forward_greedy) instead of the
logits and the sampler: the generated tokens must be those of the full path, token for token, on both op
implementations, tied and untied heads, and the default SmolLM2 GGUF model; any request that needs the
logits (logprobs, a penalty, logit_bias, min_tokens, sampling) must send its steps through the full path,
and so must a step whose fused argmax reports a NaN row."""

from __future__ import annotations

import pytest
from ops_backend import switched_ops

from fdcli_engine import LLM, SamplingParams, ops

PROMPTS = [[5, 17, 42, 99, 3], [250, 7], [11] * 9, [300, 301, 302, 303]]


@pytest.fixture(params=["native", "reference"])
def backend(request):
    yield from switched_ops(request.param)


def spy(llm):
    """Counts of the runner's fused-argmax steps (by the LM head op or with the forward) and logits
    calls, from now on."""
    runner = llm.engine.runner
    calls = {"argmax": 0, "logits": 0, "forward": 0}
    fused, logits, forward = runner._greedy_tokens, runner.model.compute_logits, runner._forward_greedy

    def counted_fused(hidden):
        calls["argmax"] += 1
        return fused(hidden)

    def counted_forward(*args):
        hidden, tokens = forward(*args)
        calls["argmax"] += tokens is not None
        calls["forward"] += tokens is not None
        return hidden, tokens

    def counted_logits(hidden):
        calls["logits"] += 1
        return logits(hidden)

    runner._greedy_tokens = counted_fused
    runner.model.compute_logits = counted_logits
    runner._forward_greedy = counted_forward
    return calls


def tokens(llm, params, prompts=PROMPTS) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def full_path_tokens(llm, params, prompts=PROMPTS) -> list[list[int]]:
    runner = llm.engine.runner
    fused, runner._greedy_tokens = runner._greedy_tokens, None
    forward, runner._forward_greedy = runner._forward_greedy, None
    try:
        return tokens(llm, params, prompts)
    finally:
        runner._greedy_tokens, runner._forward_greedy = fused, forward


@pytest.mark.parametrize("tied", [False, True])
def test_greedy_tokens_equal_the_full_path(backend, tiny_model_dir, tmp_path, tied):
    import tiny_models

    folder = tiny_model_dir() if not tied else tmp_path
    if tied:
        tiny_models.make_tiny_checkpoint("LlamaForCausalLM", folder, seed=3, tie_word_embeddings=True)
        tiny_models.write_tiny_tokenizer(folder)
    llm = LLM(str(folder), max_model_len=128, block_size=8, max_num_seqs=4)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    want = full_path_tokens(llm, params)
    calls = spy(llm)
    got = tokens(llm, params)
    assert got == want
    assert calls["argmax"] > 0 and calls["logits"] == 0
    # Native: the decode steps (every row samples) take their tokens with the forward's one op.
    assert (calls["forward"] > 0) == (backend == "native")
    # top_k=1 is greedy too (SamplingParams.is_greedy): the same rule
    assert tokens(llm, SamplingParams(temperature=0.8, top_k=1, max_tokens=12, ignore_eos=True)) == want


@pytest.mark.parametrize(
    "other",
    [
        dict(temperature=0, logprobs=2),
        dict(temperature=0, repetition_penalty=1.3),
        dict(temperature=0, logit_bias={7: 5.0}),
        dict(temperature=0, min_tokens=4, ignore_eos=False),
        dict(temperature=0.9, seed=5),
    ],
)
def test_a_request_that_reads_the_logits_takes_the_full_path(tiny_model_dir, other):
    llm = LLM(str(tiny_model_dir()), max_model_len=128, block_size=8, max_num_seqs=4)
    plain = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    special = SamplingParams(max_tokens=8, **{"ignore_eos": True, **other})
    want = full_path_tokens(llm, [plain, special], PROMPTS[:2])
    calls = spy(llm)
    outs = llm.generate(PROMPTS[:2], [plain, special])
    assert [o.outputs[0].token_ids for o in outs] == want
    if "min_tokens" in other:  # EOS is banned until 4 tokens are out, then the row is plain greedy
        assert calls["logits"] == 4 and calls["argmax"] == 4
    else:
        assert calls["argmax"] == 0 and calls["logits"] == 8
    if "logprobs" in other:
        lps = outs[1].outputs[0].logprobs  # the sampled token (the top one here) and the top 2
        assert len(lps) == 8 and all(len(lp) == 2 for lp in lps)


def test_a_nan_row_sends_the_step_to_the_full_path(tiny_model_dir, monkeypatch):
    llm = LLM(str(tiny_model_dir()), max_model_len=128, block_size=8, max_num_seqs=4)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    want = full_path_tokens(llm, params)
    calls = spy(llm)
    monkeypatch.setattr(ops, "linear_argmax", lambda x, lw: None)  # what the op says for a NaN row
    if ops.decoder_stack_greedy is not None:  # and the forward's argmax, the hidden states unchanged
        monkeypatch.setattr(ops, "decoder_stack_greedy", lambda *a: (ops.decoder_stack(*a), None))
    assert tokens(llm, params) == want
    assert calls["argmax"] > 0 and calls["logits"] == calls["argmax"] and calls["forward"] == 0


@pytest.mark.slow
def test_smollm2_greedy_tokens_equal_the_full_path():
    llm = LLM(None, max_model_len=256)
    prompts = [[1, 9690, 198, 2683, 314, 253, 5356, 30], [100 + (i * 7919) % 30000 for i in range(24)]]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    want = full_path_tokens(llm, params, prompts)
    calls = spy(llm)
    assert tokens(llm, params, prompts) == want
    assert calls["argmax"] > 0 and calls["logits"] == 0


def test_argmax_suffices_is_the_fast_paths_rule_without_logprobs():
    from fdcli_engine.runner.grammar_masks import StepMasks
    from fdcli_engine.runner.sampler import Sampler
    from fdcli_engine.step_types import ScheduledRequest

    def sreq(output=(), **kw):
        return ScheduledRequest(
            "r", [0], 0, [0], SamplingParams(**kw), True, output_token_ids=list(output), prompt_token_ids=[1]
        )

    sampler = Sampler(eos_token_ids={2})
    greedy = sreq(temperature=0)
    assert sampler.argmax_suffices([greedy, sreq(temperature=0.5, top_k=1)])
    assert not sampler.argmax_suffices([greedy, sreq(temperature=0, logprobs=0)])
    assert sampler.plain_greedy([greedy, sreq(temperature=0, logprobs=0)])
    assert not sampler.argmax_suffices([greedy, sreq(temperature=0, min_tokens=3)])
    assert sampler.argmax_suffices([greedy, sreq(output=[7, 7, 7], temperature=0, min_tokens=3)])
    assert not sampler.argmax_suffices([greedy, sreq(temperature=0, bad_words_token_ids=[[9]])])
    assert not sampler.argmax_suffices([greedy, sreq(temperature=0.7)])
    masks = StepMasks(bitmask=None, rows=[1])
    assert not sampler.argmax_suffices([greedy, greedy], masks)
