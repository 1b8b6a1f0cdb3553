"""The offline LLM as vLLM users call it: get_tokenizer, llm.chat's template arguments (rendered by the
same rule as fd serve's chat route), ValueError for bad input, cumulative_logprob and ranks."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from fdcli_engine import LLM, SamplingParams
from fdcli_engine.entrypoints.openai.protocol import ChatCompletionRequest
from fdcli_engine.entrypoints.openai.serving_chat import OpenAIServingChat

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
TOOL = {"type": "function", "function": {"name": "get_weather"}}  # short: the tiny model has 256 tokens
OPEN = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "the quick"}]


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(str(tiny_model_dir("LlamaForCausalLM")), max_model_len=256, block_size=8, num_kv_blocks=64)


def _server_render(llm, **body) -> tuple[str, list[int]]:
    chat = OpenAIServingChat(SimpleNamespace(tokenizer=llm.tokenizer), ["tiny"])
    return chat.render(ChatCompletionRequest(model="tiny", **body))


def test_get_tokenizer_is_the_models(llm):
    assert llm.get_tokenizer() is llm.tokenizer


@pytest.mark.parametrize(
    "kwargs",
    [
        {"continue_final_message": True, "add_generation_prompt": False},
        {"tools": [TOOL]},
        {"add_generation_prompt": False},
        {
            "chat_template": "{{ greeting }}|{% for m in messages %}{{ m['content'] }};{% endfor %}",
            "chat_template_kwargs": {"greeting": "hi"},
        },
    ],
)
def test_chat_renders_as_the_server_chat_route(llm, kwargs):
    messages = OPEN if kwargs.get("continue_final_message") else OPEN[:1]
    [out] = llm.chat(messages, GREEDY, **kwargs)
    text, ids = _server_render(llm, messages=messages, **kwargs)
    assert out.prompt == text and out.prompt_token_ids == ids
    if "tools" in kwargs:  # this template reads no `tools`: they go in the system prompt
        assert "get_weather" in out.prompt and out.prompt.startswith("<|im_start|>system\n# Tools")
    if kwargs.get("continue_final_message"):
        assert out.prompt.endswith("<|im_start|>assistant\nthe quick")  # no end of turn: continued
    if "chat_template_kwargs" in kwargs:
        assert out.prompt == "hi|hello;"
    assert len(out.outputs[0].token_ids) == 4


def test_chat_refusals_are_value_errors(llm):
    with pytest.raises(
        ValueError, match="Cannot set both `continue_final_message` and `add_generation_prompt`"
    ):
        llm.chat(OPEN, GREEDY, continue_final_message=True)
    with pytest.raises(ValueError, match="chat_template_kwargs may not set 'tools'"):
        llm.chat(OPEN[:1], GREEDY, chat_template_kwargs={"tools": [TOOL]})


@pytest.mark.parametrize("content_format", ["auto", "string", "openai"])
def test_chat_template_content_format_takes_the_server_flags_values(llm, content_format):
    # vLLM's LLM.chat argument; fd renders a text-only content list as one string for all three,
    # as its server does under --chat-template-content-format.
    messages = [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]
    [out] = llm.chat(messages, GREEDY, chat_template_content_format=content_format)
    assert (out.prompt, out.prompt_token_ids) == _server_render(llm, messages=OPEN[:1])


def test_bad_chat_template_content_format_is_a_value_error(llm):
    with pytest.raises(ValueError, match="chat_template_content_format 'xml': use auto, string, openai"):
        llm.chat(OPEN[:1], GREEDY, chat_template_content_format="xml")


def test_bad_params_and_long_prompts_are_value_errors(llm):
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=1.5)
    with pytest.raises(ValueError, match="maximum context length is 256") as info:
        llm.generate([1] * 300, GREEDY)
    assert info.value.param is not None
    assert llm.generate("hello", GREEDY)[0].outputs[0].token_ids  # the engine still serves


def test_cumulative_logprob_and_ranks(llm):
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=2)
    [comp] = llm.generate("hello world", params)[0].outputs
    sampled = [entry[t] for entry, t in zip(comp.logprobs, comp.token_ids)]
    assert comp.cumulative_logprob == pytest.approx(math.fsum(lp.logprob for lp in sampled), abs=1e-9)
    assert [lp.rank for lp in sampled] == [1, 1, 1, 1]  # greedy: the top token each time
    # The sampled token first (here also the top-1, so one entry), then the rest of the top-2.
    assert [lp.rank for lp in comp.logprobs[0].values()] == [1, 2]
    [plain] = llm.generate("hello world", GREEDY)[0].outputs
    assert plain.cumulative_logprob is None
    outs = llm.generate("hello", SamplingParams(n=2, best_of=2, seed=3, max_tokens=2))[0].outputs
    assert len(outs) == 2


def test_generate_takes_vllms_lora_request_none_and_priority(llm):
    prompt = "the quick brown fox"
    plain = llm.generate([prompt], GREEDY)[0].outputs[0].token_ids
    same = llm.generate([prompt], GREEDY, lora_request=None, priority=[3])[0].outputs[0].token_ids
    assert same == plain
    for call in (
        lambda: llm.generate([prompt], GREEDY, lora_request=object()),
        lambda: llm.chat([{"role": "user", "content": "hi"}], GREEDY, lora_request=object()),
    ):
        with pytest.raises(ValueError, match="fd has no LoRA adapters") as e:
            call()
        assert e.value.param == "lora_request"


def test_reset_prefix_cache_forgets_cached_prompts(llm):
    prompt = "hello world, this is a tiny tokenizer for tests " * 3
    llm.generate([prompt], GREEDY)
    assert llm.generate([prompt], GREEDY)[0].num_cached_tokens > 0
    llm.reset_prefix_cache()
    assert llm.generate([prompt], GREEDY)[0].num_cached_tokens == 0


def test_outputs_carry_vllms_request_timestamps(llm):
    """RequestOutput.metrics as vLLM's RequestStateStats: the engine core's queued, scheduled, first and
    last token times of each request, in that order and inside the front end's arrival and finish; the
    intervals keep vLLM's definitions (inference = prefill + decode; the inter-token gaps add up to
    decode)."""
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    outs = llm.generate(["one", "two three", "four five six", "seven"], params)
    _assert_request_times(outs, 5)


def test_request_timestamps_hold_under_preemption(tiny_model_dir):
    """A pool too small for the batch preempts (and recomputes) requests: their times keep their order
    and vLLM's identities, the queue time ending at the first admission."""
    from test_engine_e2e import prompts_of

    tight = LLM(
        str(tiny_model_dir("LlamaForCausalLM")),
        max_model_len=128,
        block_size=4,
        num_kv_blocks=40,
        enable_prefix_caching=False,
    )
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outs = tight.generate(prompts_of(12, seed=7, lo=3, hi=30), params)
    assert tight.get_stats()["num_preemptions"] > 0
    _assert_request_times(outs, 24)


def _assert_request_times(outs, num_tokens):
    for out in outs:
        m = out.metrics
        stamps = [m.arrival_time, m.queued_ts, m.scheduled_ts, m.first_token_ts, m.last_token_ts]
        assert stamps == sorted(stamps) and m.last_token_ts <= m.finished_time
        assert m.num_generation_tokens == len(out.outputs[0].token_ids) == num_tokens
        assert m.prefill_time + m.decode_time == pytest.approx(m.inference_time, abs=1e-9)
        assert sum(m.inter_token_latencies) == pytest.approx(m.decode_time, abs=1e-9)
        # One gap per step after the first (no drafts here: one token a step).
        assert len(m.inter_token_latencies) == num_tokens - 1
