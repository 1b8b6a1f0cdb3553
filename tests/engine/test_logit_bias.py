"""SamplingParams.logit_bias: OpenAI's semantics on the engine (added to the logits before penalties,
temperature and the filters; -100 bans, +100 all but forces), per request, with the reported logprobs
those of the raw model as vLLM reports them. Oracle: transformers' logits of the same checkpoint."""

from __future__ import annotations

import numpy as np
import pytest
import tiny_models
from test_engine_e2e import prompts_of

from fdcli_engine import LLM, SamplingParams
from fdcli_engine.errors import InvalidRequestError


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    import torch

    folder = tiny_model_dir("LlamaForCausalLM")
    hf = tiny_models.load_hf_model(folder)
    prompts = prompts_of(3, seed=11, lo=5, hi=20)
    with torch.no_grad():
        last = [torch.log_softmax(hf(torch.tensor([p])).logits[0, -1].double(), -1).numpy() for p in prompts]
    llm = LLM(str(folder), max_model_len=128, block_size=8, num_kv_blocks=64)
    return llm, prompts, last


def first_token(out) -> tuple[int, float]:
    comp = out.outputs[0]
    return comp.token_ids[0], comp.logprobs[0][comp.token_ids[0]].logprob


def test_plus_100_makes_greedy_pick_the_token(setup):
    llm, prompts, last = setup
    for p, ref in zip(prompts, last):
        target = int(np.argsort(ref)[len(ref) // 2])  # a middling token, far from the argmax
        out = llm.generate(
            [p], SamplingParams(temperature=0, max_tokens=1, logprobs=0, logit_bias={target: 100})
        )
        tok, lp = first_token(out[0])
        assert tok == target
        assert abs(lp - ref[target]) < 1e-4  # the raw logprob, not the biased one


def test_minus_100_bans_the_argmax(setup):
    llm, prompts, last = setup
    for p, ref in zip(prompts, last):
        best, second = (int(t) for t in np.argsort(-ref)[:2])
        plain = llm.generate([p], SamplingParams(temperature=0, max_tokens=1))[0]
        assert plain.outputs[0].token_ids == [best]
        out = llm.generate([p], SamplingParams(temperature=0, max_tokens=1, logit_bias={best: -100}))[0]
        assert out.outputs[0].token_ids == [second]


def test_bias_shifts_sampling_before_temperature(setup):
    """With two tokens boosted by the same large bias, sampling at any temperature stays within them."""
    llm, prompts, _ = setup
    params = SamplingParams(
        temperature=1.5, max_tokens=16, ignore_eos=True, seed=3, logit_bias={40: 50, 41: 50}
    )
    tokens = llm.generate([prompts[0]], params)[0].outputs[0].token_ids
    assert set(tokens) <= {40, 41} and len(tokens) == 16


def test_only_the_biased_request_changes(setup):
    llm, prompts, _ = setup
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    solo = [llm.generate([p], greedy)[0].outputs[0].token_ids for p in prompts]
    biased = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logit_bias={7: 100})
    outs = llm.generate(prompts, [greedy, biased, greedy])
    assert outs[0].outputs[0].token_ids == solo[0] and outs[2].outputs[0].token_ids == solo[2]
    assert outs[1].outputs[0].token_ids == [7] * 6


def test_string_keys_as_openai_sends_them():
    assert SamplingParams(logit_bias={"12": 5, "3": -1.5}).logit_bias == {12: 5.0, 3: -1.5}


@pytest.mark.parametrize(
    "bias, match",
    [
        ({"5": 100.5}, "between -100 and 100"),
        ({"5": -101}, "between -100 and 100"),
        ({"abc": 1}, "must be token ids"),
        ({"-3": 1}, "must be token ids"),
        ({"1.5": 1}, "must be token ids"),
        ({"5": "x"}, "must be numbers"),
    ],
)
def test_bad_values_name_logit_bias(bias, match):
    with pytest.raises(InvalidRequestError, match=match) as e:
        SamplingParams(logit_bias=bias)
    assert e.value.param == "logit_bias"


def test_an_id_outside_the_vocabulary_is_refused(setup):
    llm, prompts, _ = setup
    with pytest.raises(InvalidRequestError, match="outside the vocabulary") as e:
        llm.generate([prompts[0]], SamplingParams(max_tokens=1, logit_bias={llm.engine.vocab_size: 1}))
    assert e.value.param == "logit_bias"


def test_with_logit_bias_leaves_the_raw_logits_alone():
    from types import SimpleNamespace

    from fdcli_engine.runner.sampler import with_logit_bias

    logits = np.zeros((2, 4), dtype=np.float32)
    reqs = [
        SimpleNamespace(sampling_params=SamplingParams(logit_bias={1: 2.0})),
        SimpleNamespace(sampling_params=SamplingParams()),
    ]
    biased = with_logit_bias(logits, reqs)
    assert biased.tolist() == [[0, 2, 0, 0], [0, 0, 0, 0]] and not logits.any()
    assert with_logit_bias(logits, reqs[1:]) is logits  # no copy when no row has a bias
