"""ERNIE-4.5-VL through the whole engine (front end, image processor, scheduler, runner hooks, paged
KV cache) with the offline LLM: greedy tokens equal to transformers' generate on the same tiny
checkpoint, for vLLM's multi_modal_data prompts and LLM.chat image parts, in mixed batches and with
prefill chunks that split an image's placeholders.

transformers' side gets its own image processor's pixels and the prompt expanded as its processor
expands it (its full processor needs a video processor, i.e. torchvision, absent here).
"""

from __future__ import annotations

import pytest
import torch
from tiny_ernie_vl import (
    ERNIE_VL_TOKENS,
    expand_placeholders,
    hf_image_kwargs,
    hf_pixels,
    load_hf_ernie_vl,
    make_tiny_ernie_vl,
)
from tiny_models import random_image

from fdcli_engine import LLM, SamplingParams

START, END, IMG = (
    ERNIE_VL_TOKENS[k] for k in ("image_start_token_id", "image_end_token_id", "image_token_id")
)
IMAGE = "<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>"
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


PICS = [random_image(84, 56, 1), random_image(56, 112, 2), random_image(56, 56, 3)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_tiny_ernie_vl(tmp_path_factory.mktemp("ernie_vl_engine"))


@pytest.fixture(scope="module")
def hf(folder):
    return load_hf_ernie_vl(folder)


@pytest.fixture(scope="module")
def llm(folder):
    return LLM(str(folder), max_model_len=256, block_size=4, num_kv_blocks=256)


def hf_generate(
    hf, tokenizer, text: str, images: list, n: int = GREEDY.max_tokens
) -> tuple[list[int], list[int]]:
    """(transformers' expanded prompt ids, its greedy continuation)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    pixels = hf_pixels(images) if images else None
    ids = expand_placeholders(ids, pixels)
    kwargs = hf_image_kwargs(ids, pixels)
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False, **kwargs)
    return ids, out[0, len(ids) :].tolist()


def chat_text(question: str, num_images: int) -> str:
    return f"<|im_start|>user\n{IMAGE * num_images}{question}<|im_end|>\n<|im_start|>assistant\n"


def test_multi_modal_data_matches_transformers(llm, hf):
    text = chat_text("what is in it?", 1)
    (out,) = llm.generate({"prompt": text, "multi_modal_data": {"image": PICS[0]}}, GREEDY)
    ids, want = hf_generate(hf, llm.tokenizer, text, [PICS[0]])
    assert out.prompt_token_ids == ids
    assert out.outputs[0].token_ids == want


def test_chat_image_parts_match_transformers(llm, hf):
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image_pil", "image_pil": PICS[1]},
                {"type": "image_url", "image_url": {"url": PICS[2]}},
                {"type": "text", "text": "compare them"},
            ],
        }
    ]
    (out,) = llm.chat(messages, GREEDY)
    ids, want = hf_generate(hf, llm.tokenizer, chat_text("compare them", 2), PICS[1:])
    assert out.prompt_token_ids == ids
    assert out.outputs[0].token_ids == want


def test_mixed_batch_with_text_only_requests(llm, hf):
    prompts = [
        {"prompt": chat_text("one", 1), "multi_modal_data": {"image": PICS[2]}},
        chat_text("no picture here", 0),
        {"prompt": chat_text("two", 2), "multi_modal_data": {"image": [PICS[0], PICS[1]]}},
    ]
    outs = llm.generate(prompts, GREEDY)
    wants = [
        hf_generate(hf, llm.tokenizer, chat_text("one", 1), [PICS[2]])[1],
        hf_generate(hf, llm.tokenizer, chat_text("no picture here", 0), [])[1],
        hf_generate(hf, llm.tokenizer, chat_text("two", 2), PICS[:2])[1],
    ]
    assert [o.outputs[0].token_ids for o in outs] == wants


def test_chunked_prefill_splits_the_image(folder, hf):
    """Chunks of 8 tokens: the first image's 6 placeholders (at 5..10) straddle two steps, the second
    image's 8 more."""
    llm = LLM(str(folder), max_model_len=256, block_size=4, max_num_batched_tokens=8, max_num_seqs=2)
    text = chat_text("both", 2)
    (out,) = llm.generate({"prompt": text, "multi_modal_data": {"image": [PICS[0], PICS[1]]}}, GREEDY)
    ids, want = hf_generate(hf, llm.tokenizer, text, PICS[:2])
    first = ids.index(IMG)
    assert first // 8 != (first + 5) // 8  # the image really is split across chunks
    assert out.outputs[0].token_ids == want


def test_same_image_shares_the_prefix_cache(folder):
    llm = LLM(str(folder), max_model_len=256, block_size=4, enable_prefix_caching=True)
    text = chat_text("again", 1)
    first = llm.generate({"prompt": text, "multi_modal_data": {"image": PICS[0]}}, GREEDY)[0]
    again = llm.generate({"prompt": text, "multi_modal_data": {"image": PICS[0]}}, GREEDY)[0]
    other = llm.generate({"prompt": text, "multi_modal_data": {"image": PICS[2]}}, GREEDY)[0]
    image_at = first.prompt_token_ids.index(IMG)
    assert (
        again.num_cached_tokens >= image_at + 6 and again.outputs[0].token_ids == first.outputs[0].token_ids
    )
    assert other.num_cached_tokens <= image_at


def test_ngram_speculation_keeps_transformers_tokens(folder, hf):
    """Verification steps score several generated rows at once after an image prompt: positions past
    the prompt and text experts for every generated row."""
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    llm = LLM(str(folder), max_model_len=256, block_size=4, speculative_config=spec)
    text = chat_text("hi hi hi hi", 1)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    (out,) = llm.generate({"prompt": text, "multi_modal_data": {"image": PICS[0]}}, params)
    assert out.outputs[0].token_ids == hf_generate(hf, llm.tokenizer, text, [PICS[0]], n=24)[1]
    stats = llm.get_stats()
    assert stats["spec_decode_num_drafts"] > 0 and stats["spec_decode_num_accepted_tokens_total"] > 0
