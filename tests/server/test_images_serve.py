"""Pictures end to end: a real `fd serve` on a tiny random Qwen2.5-VL (tests/tiny_vl.py), driven by the
official openai SDK, answers an image_url chat with the tokens transformers generates greedily for the
same picture and text (its own processor and model); streamed and not, from a data: URL and from a file
under --allowed-local-media-path; mm_processor_kwargs reach the processor; bad pictures are 400s naming
the part with the server healthy after."""

from __future__ import annotations

import openai
import pytest
import tiny_vl
import vl_reference
from image_fixtures import corrupt_png, data_url
from server.fd_server import start_server
from vl_reference import MAX_TOKENS, QUESTION, hf_greedy, png_bytes


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_vl.make_tiny_qwen2_5_vl(tmp_path_factory.mktemp("qwen2_5_vl"))


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("media")
    (root / "b.png").write_bytes(png_bytes(tiny_vl.random_image(56, 84, seed=2)))
    return root


@pytest.fixture(scope="module")
def vl_server(folder, media_dir, tmp_path_factory):
    server = start_server(
        folder,
        tmp_path_factory.mktemp("vl-log"),
        "--served-model-name",
        "qwen-vl",
        "--allowed-local-media-path",
        str(media_dir),
        "--limit-mm-per-prompt",
        '{"image": 2}',
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def hf(folder):
    return vl_reference.load(folder)


def user_turn(*urls: str, text: str = QUESTION) -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def ask(client, messages, **extra):
    return client.chat.completions.create(
        model="qwen-vl",
        messages=messages,
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"return_token_ids": True, "ignore_eos": True, **extra},
    )


def test_chat_with_an_image_matches_transformers(vl_server, hf):
    client = vl_server.client()
    outputs = set()
    for seed, size in ((0, (56, 84)), (1, (112, 84))):
        image = tiny_vl.random_image(*size, seed=seed)
        want, prompt_len = hf_greedy(hf, [image])
        got = ask(client, user_turn(data_url(png_bytes(image))))
        assert got.choices[0].token_ids == want
        assert got.usage.prompt_tokens == prompt_len  # the placeholders were expanded as transformers does
        outputs.add(tuple(want))
    assert len(outputs) == 2  # the picture changes the answer: it reached the model


def test_tokenize_counts_the_expanded_image(vl_server, hf):
    image = tiny_vl.random_image(112, 84, seed=1)
    _, prompt_len = hf_greedy(hf, [image])
    with vl_server.http() as h:
        r = h.post("/tokenize", json={"model": "qwen-vl", "messages": user_turn(data_url(png_bytes(image)))})
    assert r.status_code == 200 and r.json()["count"] == prompt_len, r.text


def test_streamed_chat_and_a_local_file(vl_server, hf, media_dir):
    client = vl_server.client()
    image = tiny_vl.random_image(56, 84, seed=2)
    want, _ = hf_greedy(hf, [image])
    full = ask(client, user_turn(f"file://{media_dir}/b.png"))
    assert full.choices[0].token_ids == want
    stream = client.chat.completions.create(
        model="qwen-vl",
        messages=user_turn(data_url(png_bytes(image)), text=QUESTION),
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    ids, text = [], ""
    for chunk in stream:
        for choice in chunk.choices:
            ids += getattr(choice, "token_ids", None) or []
            text += choice.delta.content or ""
    assert ids == want and text == full.choices[0].message.content


def test_two_images_in_one_turn(vl_server, hf):
    images = [tiny_vl.random_image(56, 84, seed=3), tiny_vl.random_image(84, 56, seed=4)]
    want, prompt_len = hf_greedy(hf, images)
    got = ask(vl_server.client(), user_turn(*(data_url(png_bytes(i)) for i in images)))
    assert got.choices[0].token_ids == want and got.usage.prompt_tokens == prompt_len


def test_mm_processor_kwargs_reach_the_processor(vl_server, hf):
    image = tiny_vl.random_image(168, 112, seed=5)
    small = {"max_pixels": 28 * 28 * 4}
    want, prompt_len = hf_greedy(hf, [image], **small)
    default_len = hf_greedy(hf, [image])[1]
    assert prompt_len < default_len  # the option changes the image's token count
    got = ask(vl_server.client(), user_turn(data_url(png_bytes(image))), mm_processor_kwargs=small)
    assert got.choices[0].token_ids == want and got.usage.prompt_tokens == prompt_len
    with pytest.raises(openai.BadRequestError) as e:
        ask(vl_server.client(), user_turn(data_url(png_bytes(image))), mm_processor_kwargs={"frobnicate": 1})
    assert e.value.status_code == 400 and "frobnicate" in e.value.body["message"]


def test_bad_pictures_are_400s_and_the_server_stays_healthy(vl_server, hf, media_dir, tmp_path):
    client = vl_server.client()
    good = tiny_vl.random_image(56, 84, seed=0)
    outside = tmp_path / "outside.png"
    outside.write_bytes(png_bytes(good))
    cases = [
        (user_turn(data_url(corrupt_png())), "messages[0].content[0]", "corrupt"),
        (user_turn(*[data_url(png_bytes(good))] * 3), "messages[0].content[2]", "at most 2 images"),
        (user_turn(f"file://{outside}"), "messages[0].content[0]", "--allowed-local-media-path"),
        (user_turn("http://127.0.0.1:9/x.png"), "messages[0].content[0]", "--allowed-media-domains"),
    ]
    want, _ = hf_greedy(hf, [good])
    for messages, param, words in cases:
        with pytest.raises(openai.BadRequestError) as e:
            ask(client, messages)
        assert e.value.body["param"] == param and words in e.value.body["message"], e.value.body
        assert ask(client, user_turn(data_url(png_bytes(good)))).choices[0].token_ids == want


def test_base64_of_the_same_picture_shares_the_prefix_cache(vl_server):
    # The same picture sent twice: the second prompt's image blocks come from the cache.
    client = vl_server.client()
    image = png_bytes(tiny_vl.random_image(112, 112, seed=7))
    ask(client, user_turn(data_url(image), text="one"))
    again = ask(client, user_turn(data_url(image), text="one"))
    assert again.usage.prompt_tokens_details.cached_tokens > 0


def test_responses_input_image_answers_as_the_chat_does(vl_server):
    # The Responses API's input_image part goes the chat path's way: same prompt, same greedy answer.
    client = vl_server.client()
    url = data_url(png_bytes(tiny_vl.random_image(56, 84, seed=0)))
    chat = client.chat.completions.create(
        model="qwen-vl", messages=user_turn(url), max_tokens=MAX_TOKENS, temperature=0
    )
    content = [{"type": "input_image", "image_url": url}, {"type": "input_text", "text": QUESTION}]
    got = client.responses.create(
        model="qwen-vl",
        input=[{"role": "user", "content": content}],
        max_output_tokens=MAX_TOKENS,
        temperature=0,
    )
    assert got.output_text == chat.choices[0].message.content
    assert got.usage.input_tokens == chat.usage.prompt_tokens  # the image placeholders were expanded
    # an error in the image names the Responses parameter, counted past the instructions' message
    bad = [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}, {"role": "user", "content": [
        {"type": "input_image", "image_url": data_url(corrupt_png())}]}]  # fmt: skip
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="qwen-vl", input=bad, instructions="be brief", max_output_tokens=2)
    assert e.value.body["param"] == "input[1].content[0]" and "corrupt" in e.value.body["message"], (
        e.value.body
    )
