"""Pictures fetched over http(s) and the pooling routes with images, on `fd serve`'s app over a real tiny
Qwen2.5-VL engine in this process (tests/server/inproc_app.py): its MediaPolicy carries the test-only
loopback allowance, so the server fetches from the fixture server on 127.0.0.1 (tests/image_fixtures.py)
as it would from an allowed public host. Each answer is compared with transformers on the same picture:
chat, embeddings (messages with an image), FastDeploy's /v1/chat/reward example request, and
vLLM's /v2/embed with images against /v1/embeddings."""

from __future__ import annotations

import io

import numpy as np
import pytest
import tiny_vl
import vl_reference
from image_fixtures import FixtureServer, data_url, encoded
from PIL import Image
from server.inproc_app import inproc_app
from vl_reference import MAX_TOKENS, QUESTION, hf_greedy, png_bytes

from fdcli_engine.entrypoints.openai.serving_options import ServingOptions
from fdcli_engine.multimodal.media import MediaPolicy


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


def _ask(client, content: list[dict]) -> tuple[list[int], int]:
    """(the greedy answer's token ids, the prompt's token count) of one user message with `content`."""
    got = client.chat.completions.create(
        model="qwen-vl",
        messages=[{"role": "user", "content": content}],
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    return got.choices[0].token_ids, got.usage.prompt_tokens


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
            assert _ask(client, content) == (want, prompt_len)


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


def test_the_seed_reward_request_works_as_written(tmp_path_factory, fixture_server):
    """The seed's request, its URL pointed at the fixture server, on a tiny Qwen2.5-VL reward model
    (score head over every token, as fd's reward pooling reads it) served as the seed serves its own:
    `--runner pooling --convert embed`. Each token's score equals transformers' body + the head."""
    from safetensors.numpy import load_file

    folder = tiny_vl.make_tiny_qwen2_5_vl_reward(tmp_path_factory.mktemp("qwen2_5_vl_rm"))
    hf = vl_reference.load(folder)
    w = load_file(str(folder / "model.safetensors"))
    hf_messages = [
        {"role": "user", "content": [{"type": "image"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "图里有几个人"}]},
    ]
    size = {"min_pixels": 224 * 224, "max_pixels": 224 * 224}  # the request's image_size 224
    with inproc_app(folder, serving(), runner="pooling", convert="embed") as (_, http):
        scores = []
        for fmt, path in (("PNG", "/img.png"), ("JPEG", "/img.jpg")):
            r = http.post("/v1/chat/reward", json=seed_reward_request(fixture_server.url(path)))
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["object"] == "list" and body["data"][0]["object"] == "reward"
            got = np.ravel(body["data"][0]["score"])
            h = (
                vl_reference.hf_hidden_states(hf, hf_messages, [fixture_picture(fmt)], **size)
                .double()
                .numpy()
            )
            want = np.maximum(h @ w["score.0.weight"].T + w["score.0.bias"], 0) @ w["score.2.weight"].T
            want = np.ravel(want + w["score.2.bias"])
            assert body["usage"]["prompt_tokens"] == len(want)
            np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
            scores.append(got)
        assert not np.allclose(scores[0], scores[1])  # the picture reached the model


def test_chat_reads_responses_style_parts_as_vllm_does(folder, hf, fixture_server):
    # vLLM's chat parser reads input_image (image_url: the URL string) and input_text parts too.
    with inproc_app(folder, serving()) as (client, _):
        want, prompt_len = hf_greedy(hf, [fixture_picture("PNG")])
        content = [
            {"type": "input_image", "image_url": fixture_server.url("/img.png")},
            {"type": "input_text", "text": QUESTION},
        ]
        assert _ask(client, content) == (want, prompt_len)


def test_server_mm_processor_kwargs_apply_to_every_request(folder, hf):
    # vLLM's --mm-processor-kwargs: the processor's settings for every request, as transformers'
    # processor takes them; FastDeploy's image_max_pixels is the same setting.
    image = tiny_vl.random_image(168, 112, seed=5)
    small = 28 * 28 * 4
    want, prompt_len = hf_greedy(hf, [image], max_pixels=small)
    assert prompt_len < hf_greedy(hf, [image])[1]  # the setting changes the image's token count
    content = [{"type": "image_url", "image_url": {"url": data_url(png_bytes(image))}}]
    messages = [{"role": "user", "content": [*content, {"type": "text", "text": QUESTION}]}]
    for kwargs in ({"max_pixels": small}, {"image_max_pixels": small, "video_max_frames": 8}):
        with inproc_app(folder, serving(), mm_processor_kwargs=kwargs) as (client, _):
            got = client.chat.completions.create(
                model="qwen-vl",
                messages=messages,
                max_tokens=MAX_TOKENS,
                temperature=0,
                extra_body={"return_token_ids": True, "ignore_eos": True},
            )
            assert got.choices[0].token_ids == want and got.usage.prompt_tokens == prompt_len
            # A request works within the server's budget: it may not raise max_pixels past it.
            raised = client.chat.completions.create(
                model="qwen-vl",
                messages=messages,
                max_tokens=MAX_TOKENS,
                temperature=0,
                extra_body={
                    "return_token_ids": True,
                    "ignore_eos": True,
                    "mm_processor_kwargs": {"max_pixels": 4 * small},
                },
            )
            assert raised.usage.prompt_tokens == prompt_len


def test_cohere_v2_embed_images_and_inputs_equal_v1_embeddings_messages(folder):
    """vLLM's /v2/embed makes each picture, and each mixed `inputs` item, one user message of the
    /v1/embeddings messages form: the same vectors (within batching's rounding), image tokens billed
    as such for `images`."""
    url = data_url(encoded("PNG"))
    mixed = [{"type": "text", "text": "a caption"}, {"type": "image_url", "image_url": {"url": url}}]
    with inproc_app(folder, serving(), runner="pooling", convert="embed") as (_, http):

        def v1(content: list[dict]) -> tuple[np.ndarray, int]:
            r = http.post("/v1/embeddings", json={"messages": [{"role": "user", "content": content}]})
            assert r.status_code == 200, r.text
            return np.array(r.json()["data"][0]["embedding"]), r.json()["usage"]["prompt_tokens"]

        picture, picture_tokens = v1([{"type": "image_url", "image_url": {"url": url}}])
        captioned, captioned_tokens = v1(mixed)
        r = http.post("/v2/embed", json={"model": "qwen-vl", "images": [url, url]})
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(r.json()["embeddings"]["float"], [picture, picture], atol=1e-5)
        billed = r.json()["meta"]["billed_units"]
        assert billed == {"input_tokens": 0, "image_tokens": 2 * picture_tokens}
        assert "texts" not in r.json()
        r = http.post(
            "/v2/embed", json={"inputs": [{"content": mixed}], "embedding_types": ["float", "base64"]}
        )
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(r.json()["embeddings"]["float"], [captioned], atol=1e-5)
        assert r.json()["meta"]["billed_units"] == {"input_tokens": captioned_tokens, "image_tokens": 0}
        assert not np.allclose(picture, captioned, atol=1e-3)  # the caption changes the vector
