"""The reasoning budget (fdcli_engine/reasoning_budget.py): FastDeploy's reasoning_max_tokens / vLLM's
thinking_token_budget force the end of the reasoning block after exactly N reasoning tokens, and the model
answers on; FastDeploy's response_max_tokens stops the answer after N tokens. The rules on token ids,
then the tiny model through the offline LLM, checked against the model's own greedy continuations."""

from __future__ import annotations

import pytest

from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.reasoning_budget import (
    ReasoningMarkers,
    answer_token_count,
    forced_token,
    markers_for_prompt,
    reasoning_token_count,
)
from fdcli_engine.sampling_params import SamplingParams

S, E = [5, 6], [7, 8, 9]  # a two-token <think> and a three-token </think>
QWEN3 = ReasoningMarkers(end=E, start=S)  # the model opens the block itself
R1 = ReasoningMarkers(end=E)  # the prompt opened it


def _forced_run(markers: ReasoningMarkers, free: list[int], budget: int, steps: int) -> list[int]:
    """The output after `steps` steps when the model would say `free` and the budget forces."""
    out: list[int] = []
    for k in range(steps):
        token = forced_token(out, markers, budget)
        out.append(free[k] if token is None else token)
    return out


def test_budget_forces_the_end_marker_after_exactly_n_reasoning_tokens():
    free = [20 + k for k in range(12)]
    out = _forced_run(R1, free, budget=4, steps=10)
    assert out == free[:4] + E + free[7:10]  # 4 reasoning tokens, the end marker, then the answer
    assert reasoning_token_count(out, R1) == 4
    assert answer_token_count(out, R1) == 3
    # Qwen3: the count starts after the model's own <think>.
    out = _forced_run(QWEN3, S + free, budget=2, steps=9)
    assert out == S + free[:2] + E + free[5:7]
    assert reasoning_token_count(out, QWEN3) == 2
    # vLLM's budget 0: the end marker at once.
    assert _forced_run(R1, free, budget=0, steps=4) == E + [free[3]]


def test_no_forcing_once_the_model_closed_the_block_or_never_opened_one():
    out = [20, 21] + E + [30]
    assert forced_token(out, R1, 2) is None  # closed by the model within the budget
    assert reasoning_token_count(out, R1) == 2 and answer_token_count(out, R1) == 1
    plain = [40, 41, 42, 43]  # Qwen3 without a <think>: no block, all answer
    assert forced_token(plain, QWEN3, 1) is None
    assert reasoning_token_count(plain, QWEN3) == 0 and answer_token_count(plain, QWEN3) == 4
    # The first token of <think> alone may still open a block: not an answer token yet.
    assert answer_token_count([5], QWEN3) == 0
    assert answer_token_count(plain, None) == 4  # no block coming: the whole output is the answer


def test_a_natural_end_tag_split_across_the_budget_completes_under_forcing():
    out = _forced_run(R1, [20, 21, 7, 8, 50, 51, 52, 53], budget=4, steps=8)
    # The model's own 7, 8 are reasoning tokens 3 and 4; the whole end marker follows them.
    assert out[:7] == [20, 21, 7, 8] + E and reasoning_token_count(out, R1) == 4


def test_markers_from_the_prompt():
    ids = {"<think>": S, "</think>": E}.get
    assert markers_for_prompt(ids, "q<think>\n", None) == R1
    assert markers_for_prompt(ids, "q", "...</think>...") == QWEN3
    assert markers_for_prompt(ids, "q<think>\n\n</think>\n\n", "...</think>") is None  # thinking off
    assert markers_for_prompt(ids, "q", "{{ messages }}") is None  # a template without thinking
    assert markers_for_prompt(ids, "q", None, starts_inside=True) == R1


@pytest.mark.parametrize(
    "fields,param",
    [
        ({"reasoning_max_tokens": 0}, "reasoning_max_tokens"),
        ({"reasoning_max_tokens": -3}, "reasoning_max_tokens"),
        ({"reasoning_max_tokens": 2.5}, "reasoning_max_tokens"),
        ({"reasoning_max_tokens": True}, "reasoning_max_tokens"),
        ({"thinking_token_budget": -2}, "thinking_token_budget"),
        ({"thinking_token_budget": "4"}, "thinking_token_budget"),
        ({"response_max_tokens": 0}, "response_max_tokens"),
        ({"reasoning_max_tokens": 3, "thinking_token_budget": 4}, "thinking_token_budget"),
    ],
)
def test_bad_budgets_are_refused_naming_the_field(fields, param):
    with pytest.raises(InvalidRequestError) as e:
        SamplingParams(**fields)
    assert e.value.param == param


def test_budget_names_and_vllms_unlimited():
    assert SamplingParams(thinking_token_budget=-1).reasoning_budget is None
    assert SamplingParams(thinking_token_budget=0).reasoning_budget == 0
    assert SamplingParams(reasoning_max_tokens=5, thinking_token_budget=5).reasoning_budget == 5


# -- the tiny model through the offline LLM --------------------------------------------------------

# The generation prompt opens the block (DeepSeek-R1's and ERNIE's templates do): the output starts
# inside it. The tiny tokenizer spells </think> with several tokens, so the forcing spans steps.
THINK_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "<|im_start|>assistant\n<think>\n"
)
MSG = [{"role": "user", "content": "what is the answer?"}]


@pytest.fixture(scope="module")
def llm(tiny_model):
    from fdcli_engine import LLM

    return LLM(str(tiny_model), max_model_len=128, block_size=8, num_kv_blocks=64, threads=1)


def _greedy(**fields) -> SamplingParams:
    return SamplingParams(**{"temperature": 0, "max_tokens": 24, "ignore_eos": True, **fields})


def _chat(llm, params):
    return llm.chat(MSG, params, chat_template=THINK_TEMPLATE)[0]


def test_offline_budget_forces_the_end_tag_and_the_model_answers_on(llm):
    end = llm.tokenizer.encode("</think>", add_special_tokens=False)
    assert len(end) > 1
    free = list(_chat(llm, _greedy()).outputs[0].token_ids)
    assert not any(free[k : k + len(end)] == end for k in range(len(free)))  # the model never closes it
    n = 5
    for fields in ({"reasoning_max_tokens": n}, {"thinking_token_budget": n}):
        out = _chat(llm, _greedy(**fields))
        ids = list(out.outputs[0].token_ids)
        # Exactly n reasoning tokens (the model's own, unchanged), then the end tag...
        assert ids[: n + len(end)] == free[:n] + end, fields
        # ...then the model's greedy answer to the prompt with that reasoning closed.
        resumed = llm.generate(
            {"prompt_token_ids": list(out.prompt_token_ids) + ids[: n + len(end)]},
            _greedy(max_tokens=24 - n - len(end)),
        )[0]
        assert ids[n + len(end) :] == list(resumed.outputs[0].token_ids), fields
        assert out.outputs[0].finish_reason == "length"


def test_offline_response_max_tokens_bounds_the_answer(llm):
    end = llm.tokenizer.encode("</think>", add_special_tokens=False)
    out = _chat(llm, _greedy(reasoning_max_tokens=3, response_max_tokens=4)).outputs[0]
    ids = list(out.token_ids)
    assert ids[3 : 3 + len(end)] == end
    assert len(ids) == 3 + len(end) + 4 and out.finish_reason == "length"
    # Without a reasoning block in the prompt's template the whole output is the answer.
    plain = llm.generate({"prompt": "hello"}, _greedy(response_max_tokens=6))[0].outputs[0]
    assert len(plain.token_ids) == 6 and plain.finish_reason == "length"


def test_offline_budget_with_drafts_gives_the_same_tokens(llm, tiny_model):
    """Speculative decoding: each draft row is forced by the same rule, so n-gram drafts (the prompt's
    <think> tokens make good ones inside the forced end tag) change no token."""
    from fdcli_engine import LLM

    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2, "prompt_lookup_min": 1}
    spec = LLM(
        str(tiny_model),
        max_model_len=128,
        block_size=8,
        num_kv_blocks=64,
        threads=1,
        speculative_config=ngram,
    )
    for fields in ({"reasoning_max_tokens": 6}, {"thinking_token_budget": 2, "response_max_tokens": 9}):
        want = _chat(llm, _greedy(**fields)).outputs[0]
        got = _chat(spec, _greedy(**fields)).outputs[0]
        assert (list(got.token_ids), got.finish_reason) == (list(want.token_ids), want.finish_reason), fields
    assert spec.engine.scheduler.spec_stats.num_accepted_tokens > 0  # drafts were verified and kept
