"""Pictures fetched over http(s) and the pooling routes with images, on `fd serve`'s app over a real tiny
Qwen2.5-VL engine in this process (tests/server/inproc_app.py): its MediaPolicy carries the test-only
loopback allowance, so the server fetches from the fixture server on 127.0.0.1 (tests/image_fixtures.py)
as it would from an allowed public host. Each answer is compared with transformers on the same picture.

The embeddings-with-an-image and `/v1/chat/reward` tests wait on the pooling path for vision-language
models (a pooling runner that embeds images): they are strict xfails until it lands, and pass unchanged
then."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import tiny_vl
import vl_reference
from image_fixtures import FixtureServer, encoded
from PIL import Image
from server.inproc_app import inproc_app
from vl_reference import MAX_TOKENS, QUESTION, hf_greedy

from fdcli_engine.entrypoints.openai.serving_options import ServingOptions
from fdcli_engine.multimodal.media import MediaPolicy

WAITING = pytest.mark.xfail(
    strict=True, reason="waiting on the pooling path for vision-language models (images on --runner pooling)"
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_vl.make_tiny_qwen2_5_vl(tmp_path_factory.mktemp("qwen2_5_vl"))


@pytest.fixture(scope="module")
def hf(folder):
    return vl_reference.load(folder)


@pytest.fixture(scope="module")
def fixture_server():
    with FixtureServer() as s:
        yield s


def serving() -> ServingOptions:
    policy = MediaPolicy(allowed_domains=("127.0.0.1",), timeout_s=5.0, allow_loopback_first_hop=True)
    return ServingOptions(served_model_names=["qwen-vl"], media_policy=policy)


def fixture_picture(fmt: str) -> Image.Image:
    """The picture the fixture server sends for /img.<fmt>, decoded as the server decodes it."""
    return Image.open(io.BytesIO(encoded(fmt))).convert("RGB")


def test_chat_with_a_fetched_picture_matches_transformers(folder, hf, fixture_server):
    with inproc_app(folder, serving()) as (client, _):
        for fmt, path in (("PNG", "/img.png"), ("JPEG", "/img.jpg")):
            want, prompt_len = hf_greedy(hf, [fixture_picture(fmt)])
            content = [
                {"type": "image_url", "image_url": {"url": fixture_server.url(path)}},
                {"type": "text", "text": QUESTION},
            ]
            got = client.chat.completions.create(
                model="qwen-vl",
                messages=[{"role": "user", "content": content}],
                max_tokens=MAX_TOKENS,
                temperature=0,
                extra_body={"return_token_ids": True, "ignore_eos": True},
            )
            assert got.choices[0].token_ids == want and got.usage.prompt_tokens == prompt_len


@WAITING
def test_embeddings_with_a_picture_match_transformers(folder, hf, fixture_server):
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": fixture_server.url("/img.png")}},
                {"type": "text", "text": "a caption"},
            ],
        }
    ]
    hf_messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "a caption"}]}]
    want = vl_reference.hf_last_hidden(hf, hf_messages, [fixture_picture("PNG")]).numpy()
    want = want / np.linalg.norm(want)
    with inproc_app(folder, serving(), runner="pooling", convert="embed") as (_, http):
        r = http.post("/v1/embeddings", json={"model": "qwen-vl", "messages": messages})
        assert r.status_code == 200, r.text
        got = np.array(r.json()["data"][0]["embedding"], dtype=np.float32)
    np.testing.assert_allclose(got, want, atol=1e-4)


def seed_reward_request(image_url: str) -> dict:
    """FastDeploy's /v1/chat/reward example (docs/features/pooling_models.md) as written, but its URL."""
    return {
        "model": "",
        "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": image_url}}]},
            {"role": "assistant", "content": [{"type": "text", "text": "图里有几个人"}]},
        ],
        "user": "user-123",
        "chat_template": None,
        "chat_template_kwargs": {"custom_var": "value"},
        "mm_processor_kwargs": {"image_size": 224},
    }


@WAITING
def test_the_seed_reward_request_works_as_written(folder, fixture_server):
    # The seed serves its reward model with `--runner pooling --convert embed`, as here.
    with inproc_app(folder, serving(), runner="pooling", convert="embed") as (_, http):
        scores = []
        for path in ("/img.png", "/img.jpg"):
            r = http.post("/v1/chat/reward", json=seed_reward_request(fixture_server.url(path)))
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["object"] == "list" and body["data"][0]["object"] == "reward"
            score = body["data"][0]["score"]
            assert score and all(math.isfinite(v) for v in np.ravel(score))
            scores.append(np.ravel(score))
        assert not np.allclose(scores[0], scores[1])  # the picture reached the model
