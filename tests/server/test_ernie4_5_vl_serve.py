"""ERNIE-4.5-VL behind a real `fd serve`, through the official openai SDK: a chat turn with an
`image_url` part (a data: URL of a PNG) answers with transformers' greedy tokens for the same picture
and text, streamed or not, and FastDeploy's `mm_processor_kwargs` (max_pixels) reaches the image
processor."""

from __future__ import annotations

import io

import pytest
import torch
from fd_server import start_server
from image_fixtures import data_url
from PIL import Image
from tiny_ernie_vl import (
    expand_placeholders,
    hf_image_kwargs,
    hf_pixels,
    load_hf_ernie_vl,
    make_tiny_ernie_vl,
)
from tiny_models import random_image
from vl_reference import png_bytes

PROMPT = "<|im_start|>user\n<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>what is it?<|im_end|>\n<|im_start|>assistant\n"
MAX_TOKENS = 8


def png(width=84, height=112, seed=5) -> bytes:
    return png_bytes(random_image(width, height, seed))


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

    tok = AutoTokenizer.from_pretrained(folder)
    size = {"shortest_edge": 56 * 56, "longest_edge": max_pixels} if max_pixels else {}
    px = hf_pixels([image], **({"size": size} if size else {}))
    ids = expand_placeholders(tok.encode(PROMPT, add_special_tokens=False), px)
    with torch.no_grad():
        out = load_hf_ernie_vl(folder).generate(
            torch.tensor([ids]),
            max_new_tokens=MAX_TOKENS,
            min_new_tokens=MAX_TOKENS,
            do_sample=False,
            **hf_image_kwargs(ids, px),
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
