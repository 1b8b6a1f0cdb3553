"""Qwen2.5-VL through the whole offline engine (`LLM`), against transformers on a tiny random
checkpoint (tests/tiny_vl.py): fd takes the picture itself (its own processor), transformers takes
its own image processor's output (the processors agree within 1e-5: tests/multimodal).

Prompt log-probs (every prompt position's top-5) are the logits check, within 1e-4 in fp32; greedy
tokens are exact. Chunked prefill runs 16-token steps, so the image's placeholders are cut across
steps, with a text-only request in the same steps."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import tiny_vl

from fdcli_engine import LLM, SamplingParams
from fdcli_engine.errors import ConfigError, InvalidRequestError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ATOL = 1e-4
K = 5
IMAGE_PROMPT = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>hello world<|im_end|>\n<|im_start|>assistant\n"
TEXT_PROMPT = "<|im_start|>user\nthe quick brown fox<|im_end|>\n<|im_start|>assistant\n"
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_vl.make_tiny_qwen2_5_vl(tmp_path_factory.mktemp("qwen2_5_vl"))


@pytest.fixture(scope="module")
def hf(folder):
    model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
        folder, attn_implementation="eager"
    )
    return model.eval(), transformers.Qwen2VLImageProcessorPil.from_pretrained(folder)


def _llm(folder, **kw):
    return LLM(str(folder), max_model_len=256, block_size=8, num_kv_blocks=128, **kw)


@pytest.fixture(scope="module")
def llm(folder):
    return _llm(folder)


def _hf_inputs(hf, ids: list[int], images):
    """transformers' inputs: its image processor's pixels, each placeholder expanded by its grid."""
    model, ip = hf
    pad = model.config.image_token_id
    out, kwargs = list(ids), {}
    if images:
        pp = ip(images=images, return_tensors="np")
        expanded = []
        grids = iter(pp["image_grid_thw"])
        for t in ids:
            expanded += [pad] * (int(np.prod(next(grids))) // 4) if t == pad else [t]
        out = expanded
        kwargs = dict(
            pixel_values=torch.tensor(pp["pixel_values"]), image_grid_thw=torch.tensor(pp["image_grid_thw"])
        )
    t = torch.tensor([out])
    kwargs.update(input_ids=t, attention_mask=torch.ones_like(t), mm_token_type_ids=(t == pad).int())
    return out, kwargs


def _hf_log_softmax(hf, ids, images):
    full, kwargs = _hf_inputs(hf, ids, images)
    with torch.no_grad():
        logits = hf[0](**kwargs).logits[0].double()
    return full, torch.log_softmax(logits, -1).numpy()


def _hf_greedy(hf, ids, images, n):
    full, kwargs = _hf_inputs(hf, ids, images)
    with torch.no_grad():
        out = hf[0].generate(**kwargs, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, len(full) :].tolist()


def _check_prompt_logprobs(out, full_ids, ref):
    assert list(out.prompt_token_ids) == full_ids
    pl = out.prompt_logprobs
    assert len(pl) == len(full_ids) and pl[0] is None
    worst = 0.0
    for pos in range(1, len(full_ids)):
        for tok, lp in pl[pos].items():
            worst = max(worst, abs(lp.logprob - ref[pos - 1][tok]))
    assert worst <= ATOL, worst


def _record_steps(llm) -> list[list[tuple[bool, int, int]]]:
    """Per executed step, (has images, first, end) of each scheduled chunk."""
    mm, steps = llm.engine.runner.mm, []
    prepare = mm.prepare

    def spy(scheduled, *args):
        steps.append(
            [
                (bool(s.mm_features), s.num_computed_tokens, s.num_computed_tokens + len(s.token_ids))
                for s in scheduled
            ]
        )
        return prepare(scheduled, *args)

    mm.prepare = spy
    return steps


@pytest.mark.parametrize("chunk", [None, 16])
def test_logprobs_and_greedy_match_transformers(folder, hf, chunk):
    """One-step prefill, and 16-token chunks that cut the image with a text request in the same steps."""
    llm = _llm(folder, **({"max_num_batched_tokens": chunk} if chunk else {}))
    steps = _record_steps(llm)
    image = tiny_vl.random_image(168, 112, seed=1)  # 24 image tokens, several vision windows
    ids = llm.tokenizer.encode(IMAGE_PROMPT)
    text_ids = llm.tokenizer.encode(TEXT_PROMPT)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, prompt_logprobs=K)
    outs = llm.generate([TEXT_PROMPT, {"prompt": IMAGE_PROMPT, "multi_modal_data": {"image": image}}], params)
    full, ref = _hf_log_softmax(hf, ids, [image])
    _check_prompt_logprobs(outs[1], full, ref)
    _check_prompt_logprobs(outs[0], *_hf_log_softmax(hf, text_ids, []))
    assert outs[1].outputs[0].token_ids == _hf_greedy(hf, ids, [image], 6)
    assert outs[0].outputs[0].token_ids == _hf_greedy(hf, text_ids, [], 6)
    runner = llm.engine.runner
    assert runner.mm.num_encoded_images == 1  # once for the request, whatever the chunks
    if chunk:  # the schedule did what this test is about
        start = full.index(hf[0].config.image_token_id)
        cuts = [end for step in steps for has_mm, _, end in step if has_mm]
        assert any(start < c < start + 24 for c in cuts), steps  # a step ended inside the image
        assert any(len({m for m, _, _ in step}) == 2 for step in steps), steps  # image + text together
    llm.generate(TEXT_PROMPT, GREEDY)  # the finished request reaches the runner with the next step
    assert not runner.mm._states  # its encoder rows and positions are gone


def test_two_images_and_mm_processor_kwargs(llm, hf, folder):
    a, b = tiny_vl.random_image(84, 56, seed=2), tiny_vl.random_image(300, 200, seed=3)
    prompt = IMAGE_PROMPT.replace("hello", "<|vision_start|><|image_pad|><|vision_end|>hello")
    ids = llm.tokenizer.encode(prompt)
    out = llm.generate({"prompt": prompt, "multi_modal_data": {"image": [a, b]}}, GREEDY)[0]
    assert out.outputs[0].token_ids == _hf_greedy(hf, ids, [a, b], 6)
    small = llm.generate(
        {
            "prompt": IMAGE_PROMPT,
            "multi_modal_data": {"image": b},
            "mm_processor_kwargs": {"max_pixels": 28 * 28 * 4},
        },
        GREEDY,
    )[0]
    pad = hf[0].config.image_token_id
    ip = transformers.Qwen2VLImageProcessorPil.from_pretrained(folder, max_pixels=28 * 28 * 4)
    grid = ip(images=[b], return_tensors="np")["image_grid_thw"][0]
    assert small.prompt_token_ids.count(pad) == int(np.prod(grid)) // 4 < 24


def test_prefix_cache_is_keyed_by_the_image(folder):
    llm = _llm(folder)
    a, b = tiny_vl.random_image(168, 112, seed=4), tiny_vl.random_image(168, 112, seed=5)
    first = llm.generate({"prompt": IMAGE_PROMPT, "multi_modal_data": {"image": a}}, GREEDY)[0]
    same = llm.generate({"prompt": IMAGE_PROMPT, "multi_modal_data": {"image": a.copy()}}, GREEDY)[0]
    other = llm.generate({"prompt": IMAGE_PROMPT, "multi_modal_data": {"image": b}}, GREEDY)[0]
    image_start = first.prompt_token_ids.index(llm.engine.model.image_token_id)
    n = len(first.prompt_token_ids)
    assert first.num_cached_tokens == 0
    assert same.num_cached_tokens == (n - 1) // 8 * 8  # every full block, the image's included
    assert same.num_cached_tokens > image_start + 24
    assert other.num_cached_tokens == image_start // 8 * 8  # only the blocks before the image
    assert same.outputs[0].token_ids == first.outputs[0].token_ids


def test_chat_with_a_data_url_and_a_pil_image(llm, hf):
    image = tiny_vl.random_image(84, 56, seed=6)
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "hello world"}]
    by_url = llm.chat([{"role": "user", "content": content}], GREEDY)[0]
    content[0] = {"type": "image_url", "image_url": {"url": image}}
    by_pil = llm.chat([{"role": "user", "content": content}], GREEDY)[0]
    ids = llm.tokenizer.encode(IMAGE_PROMPT)
    assert by_url.outputs[0].token_ids == by_pil.outputs[0].token_ids == _hf_greedy(hf, ids, [image], 6)
    # vLLM's chat parser reads the Responses API's parts too: input_image (the URL string), input_text.
    content = [{"type": "input_image", "image_url": url}, {"type": "input_text", "text": "hello world"}]
    by_input = llm.chat([{"role": "user", "content": content}], GREEDY)[0]
    assert by_input.prompt_token_ids == by_url.prompt_token_ids
    assert by_input.outputs[0].token_ids == by_url.outputs[0].token_ids


def test_bad_image_requests(llm, tiny_model_dir):
    image = tiny_vl.random_image(84, 56)
    with pytest.raises(InvalidRequestError, match="placeholder"):
        llm.generate({"prompt": "no placeholder here", "multi_modal_data": {"image": image}}, GREEDY)
    with pytest.raises(InvalidRequestError, match="unknown key"):
        llm.generate(
            {"prompt": IMAGE_PROMPT, "multi_modal_data": {"image": image}, "mm_processor_kwargs": {"x": 1}},
            GREEDY,
        )
    with pytest.raises(ValueError, match="only images"):
        llm.generate({"prompt": IMAGE_PROMPT, "multi_modal_data": {"video": [image]}}, GREEDY)
    text_llm = LLM(str(tiny_model_dir("Qwen2ForCausalLM")), max_model_len=64, block_size=8, num_kv_blocks=32)
    with pytest.raises(InvalidRequestError, match="does not accept images"):
        text_llm.generate({"prompt": "hi", "multi_modal_data": {"image": image}}, GREEDY)
    # the engine is still serving after every refusal
    assert llm.generate(TEXT_PROMPT, GREEDY)[0].outputs[0].token_ids


def test_preempted_image_requests_resume_exactly(folder, llm):
    """A KV cache too small for the batch preempts image requests mid-way; recomputed, they give the
    answers of a roomy engine (encoder rows reused, positions unchanged)."""
    images = [tiny_vl.random_image(168, 112, seed=10 + i) for i in range(3)]
    requests = [{"prompt": IMAGE_PROMPT, "multi_modal_data": {"image": im}} for im in images]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in llm.generate(requests, params)]
    tight = LLM(str(folder), max_model_len=128, block_size=8, num_kv_blocks=16, enable_prefix_caching=False)
    got = [o.outputs[0].token_ids for o in tight.generate(requests, params)]
    assert tight.get_stats()["num_preemptions"] > 0
    assert got == want
    assert tight.engine.runner.mm.num_encoded_images == 3  # a recompute reuses the rows it kept


def test_ngram_drafts_on_an_image_prompt_keep_the_greedy_answer(folder, llm):
    """Verified drafts sit past the prompt: their positions are index + the image's delta."""
    image = tiny_vl.random_image(168, 112, seed=20)
    request = {"prompt": IMAGE_PROMPT, "multi_modal_data": {"image": image}}
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    want = llm.generate(request, params)[0].outputs[0].token_ids
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    fast = _llm(folder, speculative_config=spec)
    assert fast.generate(request, params)[0].outputs[0].token_ids == want
    assert fast.get_stats()["spec_decode_num_draft_tokens_total"] > 0


def test_limit_mm_per_prompt_caps_a_prompts_pictures(folder, llm):
    # vLLM's LLM(limit_mm_per_prompt=...), in its older KEY=VALUE form here.
    capped = _llm(folder, limit_mm_per_prompt="image=1")
    image = tiny_vl.random_image(56, 84, seed=7)
    two = IMAGE_PROMPT.replace("hello", "<|vision_start|><|image_pad|><|vision_end|>hello")
    with pytest.raises(
        InvalidRequestError, match=r"at most 1 images per prompt \(limit_mm_per_prompt\), got 2"
    ):
        capped.generate({"prompt": two, "multi_modal_data": {"image": [image, image]}}, GREEDY)
    one = capped.generate({"prompt": IMAGE_PROMPT, "multi_modal_data": {"image": image}}, GREEDY)[0]
    want = llm.generate({"prompt": IMAGE_PROMPT, "multi_modal_data": {"image": image}}, GREEDY)[0]
    assert one.outputs[0].token_ids == want.outputs[0].token_ids


def test_limit_mm_per_prompt_refuses_a_bad_count_before_loading(folder):
    with pytest.raises(ConfigError, match="'image' needs a count of 0 or more"):
        _llm(folder, limit_mm_per_prompt={"image": -2, "video": 1})


def test_llm_chat_reads_local_files_under_allowed_local_media_path(folder, llm, tmp_path):
    # vLLM's LLM(allowed_local_media_path=...): LLM.chat's file:// parts read files under that folder.
    image = tiny_vl.random_image(84, 56, seed=6)
    image.save(tmp_path / "a.png")
    content = [
        {"type": "image_url", "image_url": {"url": f"file://{tmp_path}/a.png"}},
        {"type": "text", "text": "hello world"},
    ]
    with pytest.raises(InvalidRequestError, match="local files are not served"):
        llm.chat([{"role": "user", "content": content}], GREEDY)
    local = _llm(folder, allowed_local_media_path=str(tmp_path))
    by_file = local.chat([{"role": "user", "content": content}], GREEDY)[0]
    content[0] = {"type": "image_pil", "image_pil": image}
    by_pil = llm.chat([{"role": "user", "content": content}], GREEDY)[0]
    assert by_file.outputs[0].token_ids == by_pil.outputs[0].token_ids
    with pytest.raises(ConfigError, match="is not a folder"):
        _llm(folder, allowed_local_media_path=str(tmp_path / "a.png"))
