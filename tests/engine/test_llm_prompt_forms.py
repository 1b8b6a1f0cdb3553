"""`LLM.generate` takes vLLM's prompt forms (str, token ids, {"prompt"}, {"prompt_token_ids"}, lists of
them, mixed); bad forms fail up front with a ValueError/TypeError that names the prompt and the key.

Oracle: the same prompt given as plain token ids (checked against transformers in test_engine_e2e)."""

from __future__ import annotations

import pytest

from fdcli_engine import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
TEXTS = ["hello world", "the quick brown fox"]


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(str(tiny_model_dir("LlamaForCausalLM")), max_model_len=64, block_size=8, num_kv_blocks=64)


def _tokens(outs):
    return [o.outputs[0].token_ids for o in outs]


def test_every_form_gives_the_token_id_prompts_output(llm):
    ids = [llm.tokenizer.encode(t) for t in TEXTS]
    reference = _tokens(llm.generate(ids, GREEDY))
    assert _tokens(llm.generate(TEXTS, GREEDY)) == reference
    assert _tokens(llm.generate([{"prompt": t} for t in TEXTS], GREEDY)) == reference
    assert _tokens(llm.generate([{"prompt_token_ids": i} for i in ids], GREEDY)) == reference
    mixed = [{"prompt": TEXTS[0]}, {"prompt_token_ids": ids[1]}]
    outs = llm.generate(mixed, GREEDY)
    assert _tokens(outs) == reference
    assert outs[0].prompt == TEXTS[0] and outs[1].prompt is None
    assert [o.prompt_token_ids for o in outs] == ids


def test_single_prompts_in_each_form(llm):
    ids = llm.tokenizer.encode(TEXTS[1])
    (ref,) = _tokens(llm.generate(ids, GREEDY))  # a flat list of ints is one prompt, as in vLLM
    assert _tokens(llm.generate(TEXTS[1], GREEDY)) == [ref]
    assert _tokens(llm.generate({"prompt": TEXTS[1]}, GREEDY)) == [ref]
    out = llm.generate({"prompt_token_ids": ids, "prompt": "shown only"}, GREEDY)
    assert _tokens(out) == [ref] and out[0].prompt == "shown only"  # the ids win, as in vLLM
    assert _tokens(llm.generate({"prompt": TEXTS[1], "mm_processor_kwargs": {}}, GREEDY)) == [ref]
    assert llm.generate([], GREEDY) == []
    import numpy as np

    assert _tokens(llm.generate({"prompt_token_ids": list(np.array(ids))}, GREEDY)) == [ref]


@pytest.mark.parametrize(
    "prompts, error, message",
    [
        ({"text": "hi"}, ValueError, "unknown prompt key(s) ['text']"),
        ({}, ValueError, "needs 'prompt' (text) or 'prompt_token_ids'"),
        ({"prompt": "hi", "multi_modal_data": {"image": object()}}, TypeError, "must be a PIL image"),
        ([{"prompt": "hi"}, {"prompt_embeds": [[0.1]]}], ValueError, "prompts[1]: 'prompt_embeds'"),
        ({"encoder_prompt": "a", "decoder_prompt": "b"}, ValueError, "encoder-decoder"),
        ({"prompt": ["hi"]}, TypeError, "'prompt' must be a str"),
        ({"prompt_token_ids": "1 2 3"}, TypeError, "must be a list of ints, got str"),
        ([[1, 2], [3, "x"]], TypeError, "prompts[1]: token ids must be ints, got str"),
        ([[1, 2.5]], TypeError, "got float"),
        ([[1, True]], TypeError, "got bool"),
        ([1, "a"], TypeError, "prompts[0]: expected a str"),
        (None, TypeError, "got NoneType"),
        (7, TypeError, "got int"),
    ],
)
def test_bad_forms_fail_up_front_with_a_clear_message(llm, prompts, error, message):
    with pytest.raises(error) as exc:
        llm.generate(prompts, GREEDY)
    assert message in str(exc.value)
    assert not llm.engine.has_unfinished_requests()
    assert _tokens(llm.generate("hello world", GREEDY))  # the LLM still works


def test_cache_salt_in_a_prompt_dict_isolates_the_prefix_cache(llm):
    ids = list(range(5, 5 + 40))  # five full blocks of 8

    def cached(**salt):
        (out,) = llm.generate([{"prompt_token_ids": ids, **salt}], GREEDY)
        return out.num_cached_tokens

    cached(cache_salt="a")
    assert cached(cache_salt="a") > 0
    assert cached(cache_salt="b") == 0 and cached() == 0
    assert cached() > 0
    with pytest.raises(TypeError, match="cache_salt"):
        llm.generate([{"prompt_token_ids": ids, "cache_salt": 7}], GREEDY)
