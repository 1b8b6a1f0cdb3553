"""Issue #27's bad image inputs through the official openai SDK against the in-process `fd serve` app
(a scripted text-only engine): each is a 400 naming the content part, with no address, port or path in
its message, nothing reaches the engine, and a good request is answered right after. URL cases go to a
fixture HTTP server on 127.0.0.1 (tests/image_fixtures.py); the server's MediaPolicy carries the
test-only loopback allowance for the first hop."""

from __future__ import annotations

import openai
import pytest
from image_fixtures import FixtureServer, corrupt_png, data_url, encoded, huge_png_header, truncated
from scripted import scripted_client

from fdcli_engine.multimodal.media import MediaPolicy

PIECES = ["fine", "."]


@pytest.fixture(scope="module")
def fixture_server():
    with FixtureServer() as s:
        yield s


@pytest.fixture(scope="module")
def media_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("media")
    (root / "ok.png").write_bytes(encoded("PNG"))
    outside = tmp_path_factory.mktemp("elsewhere") / "secret.png"
    outside.write_bytes(encoded("PNG"))
    (root / "escape.png").symlink_to(outside)
    return root, outside


@pytest.fixture(scope="module")
def app(tokenizer, media_root):
    policy = MediaPolicy(
        allowed_local_path=str(media_root[0]),
        allowed_domains=("127.0.0.1", "10.0.0.1", "169.254.169.254"),
        max_bytes=1 << 20,
        timeout_s=2.0,
        allow_loopback_first_hop=True,
    )
    return scripted_client(tokenizer, PIECES, media_policy=policy, limit_mm_per_prompt='{"image": 2}')


def image_message(*urls, string_form: bool = False) -> list[dict]:
    parts = [{"type": "text", "text": "what is this?"}]
    for url in urls:
        parts.append({"type": "image_url", "image_url": url if string_form else {"url": url}})
    return [{"role": "user", "content": parts}]


def assert_refused(app, messages, param: str, *words: str, stream: bool = False, secrets=()) -> str:
    client, _, engine = app
    before = len(engine.calls)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="fake", messages=messages, stream=stream, max_tokens=4)
    err = info.value.body
    assert info.value.status_code == 400 and err["param"] == param, err
    for word in words:
        assert word in err["message"], err
    for secret in ("127.0.0.1", "10.0.0.1", "169.254", "Traceback", "/tmp", "secret", *secrets):
        assert secret not in err["message"], err
    assert len(engine.calls) == before  # nothing reached the engine
    # The server is healthy: a good request is answered right after.
    reply = client.chat.completions.create(model="fake", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content == "fine."
    return err["message"]


P1 = "messages[0].content[1]"


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: data_url(corrupt_png()), ["corrupt or truncated"]),
        (lambda: data_url(truncated("PNG")), ["corrupt or truncated"]),
        (lambda: data_url(truncated("JPEG"), "image/jpeg"), ["corrupt or truncated"]),
        (lambda: data_url(huge_png_header(50_000, 50_000)), ["too large", "50000x50000"]),
        (lambda: data_url(encoded("GIF")), ["GIF images are not supported"]),
        (lambda: data_url(encoded("BMP"), "image/png"), ["BMP images are not supported"]),
        (lambda: "data:image/png;base64,!!!", ["base64"]),
    ],
    ids=["corrupt", "truncated-png", "truncated-jpeg", "huge-header", "gif", "bmp", "bad-base64"],
)
def test_bad_data_urls(app, make, words):
    assert_refused(app, image_message(make()), P1, *words)


def test_bad_image_refused_on_a_stream_too(app):
    assert_refused(app, image_message(data_url(corrupt_png())), P1, "corrupt", stream=True)


def test_too_many_images(app):
    good = data_url(encoded("PNG"))
    assert_refused(app, image_message(good, good, good), "messages[0].content[3]", "at most 2 images")


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("/to-loopback", ["non-public"]),
        ("/to-private", ["non-public"]),
        ("/to-link-local", ["non-public"]),
        ("/endless", ["larger than"]),
        ("/stall", ["longer than 2 s"]),
        ("/corrupt.png", ["corrupt or truncated"]),
        ("/huge.png", ["too large"]),
        ("/img.gif", ["GIF"]),
    ],
)
def test_bad_urls(app, fixture_server, path, words):
    port = f":{fixture_server.httpd.server_address[1]}"
    assert_refused(app, image_message(fixture_server.url(path)), P1, *words, secrets=(port,))


def test_host_not_allowed(app):
    assert_refused(app, image_message("https://images.example.com/cat.png"), P1, "--allowed-media-domains")


def test_local_files_outside_the_allowed_path(app, media_root):
    root, outside = media_root
    for url in (f"file://{outside}", f"file://{root}/escape.png", f"file://{root}/../x.png"):
        assert_refused(app, image_message(url), P1, "--allowed-local-media-path")


def test_other_media_parts_say_what_to_send(app):
    messages = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": "v"}}]}]
    assert_refused(app, messages, "messages[0].content[0]", "send pictures as image_url parts")


@pytest.mark.parametrize("string_form", [False, True])
def test_good_image_on_a_text_model(app, fixture_server, media_root, string_form):
    # Each source loads and passes every check, then the text-only model refuses it, naming the part.
    root, _ = media_root
    for url in (data_url(encoded("PNG")), fixture_server.url("/img.png"), f"file://{root}/ok.png"):
        message = assert_refused(
            app, image_message(url, string_form=string_form), P1, "does not accept images"
        )
        assert "'fake'" in message


def test_server_without_flags_fetches_nothing(tokenizer, fixture_server, media_root):
    app = scripted_client(tokenizer, PIECES)  # the defaults: no http(s), no local files
    assert_refused(app, image_message(fixture_server.url("/img.png")), P1, "--allowed-media-domains")
    assert_refused(app, image_message(f"file://{media_root[0]}/ok.png"), P1, "--allowed-local-media-path")
