"""ERNIE-4.5-VL behind a real `fd serve`, through the official openai SDK: a chat turn with an
`image_url` part (a data: URL of a PNG) answers with transformers' greedy tokens for the same picture
and text, streamed or not, and FastDeploy's `mm_processor_kwargs` (max_pixels) reaches the image
processor."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from fd_server import start_server
from image_fixtures import data_url
from PIL import Image
from tiny_ernie_vl import ERNIE_VL_TOKENS, load_hf_ernie_vl, make_tiny_ernie_vl

START, END, IMG = (
    ERNIE_VL_TOKENS[k] for k in ("image_start_token_id", "image_end_token_id", "image_token_id")
)
PROMPT = "<|im_start|>user\n<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>what is it?<|im_end|>\n<|im_start|>assistant\n"
MAX_TOKENS = 8


def png(width=84, height=112, seed=5) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_tiny_ernie_vl(tmp_path_factory.mktemp("ernie_vl_serve"))


@pytest.fixture(scope="module")
def server(folder, tmp_path_factory):
    s = start_server(
        folder, tmp_path_factory.mktemp("log"), "--served-model-name", "tiny", "--max-model-len", "256"
    )
    yield s
    s.stop()


def hf_text(folder, image: Image.Image, max_pixels: int | None = None) -> tuple[str, int]:
    """(transformers' greedy answer, its prompt length) for PROMPT with `image`."""
    from transformers import AutoTokenizer
    from transformers.models.ernie4_5_vl_moe.image_processing_pil_ernie4_5_vl_moe import (
        Ernie4_5_VLMoeImageProcessorPil,
    )

    tok = AutoTokenizer.from_pretrained(folder)
    size = {"shortest_edge": 56 * 56, "longest_edge": max_pixels} if max_pixels else {}
    px = Ernie4_5_VLMoeImageProcessorPil(**({"size": size} if size else {}))(
        images=[image], return_tensors="np"
    )
    n = int(np.prod(px["image_grid_thw"][0])) // 4
    ids = [t for i in tok.encode(PROMPT, add_special_tokens=False) for t in ([IMG] * n if i == IMG else [i])]
    arr = np.asarray(ids)
    with torch.no_grad():
        out = load_hf_ernie_vl(folder).generate(
            torch.tensor([ids]),
            max_new_tokens=MAX_TOKENS,
            min_new_tokens=MAX_TOKENS,
            do_sample=False,
            pixel_values=torch.tensor(px["pixel_values"]),
            image_grid_thw=torch.tensor(px["image_grid_thw"]),
            mm_token_type_ids=torch.tensor((arr == IMG).astype(np.int64)[None]),
            moe_mm_token_type_ids=torch.tensor(np.isin(arr, (START, END, IMG)).astype(np.int64)[None]),
        )
    return tok.decode(out[0, len(ids) :].tolist(), skip_special_tokens=True), len(ids)


def messages(url: str) -> list[dict]:
    return [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": "what is it?"},
            ],
        }
    ]


@pytest.mark.parametrize("max_pixels", [None, 28 * 28 * 4])
def test_chat_with_an_image_matches_transformers(server, folder, max_pixels):
    data = png()
    want, prompt_len = hf_text(folder, Image.open(io.BytesIO(data)).convert("RGB"), max_pixels)
    extra = {"ignore_eos": True}
    if max_pixels:
        extra["mm_processor_kwargs"] = {"max_pixels": max_pixels}
    client = server.client()
    resp = client.chat.completions.create(
        model="tiny",
        messages=messages(data_url(data)),
        temperature=0,
        max_tokens=MAX_TOKENS,
        extra_body=extra,
    )
    assert resp.choices[0].message.content == want
    assert resp.usage.prompt_tokens == prompt_len
    stream = client.chat.completions.create(
        model="tiny",
        messages=messages(data_url(data)),
        temperature=0,
        max_tokens=MAX_TOKENS,
        extra_body=extra,
        stream=True,
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == want
