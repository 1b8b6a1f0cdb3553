"""load_image on every source and every bad input of issue #27, without a model: data: URLs, local
files under --allowed-local-media-path, and http(s) through a fixture server on 127.0.0.1."""

from __future__ import annotations

import os

import pytest
from image_fixtures import (
    FixtureServer,
    corrupt_png,
    data_url,
    encoded,
    huge_png_header,
    picture,
    truncated,
)

from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.multimodal.image_check import content_hash
from fdcli_engine.multimodal.media import MediaPolicy, load_image

PARAM = "messages[0].content[1]"
SECRETS: list[str] = []  # the fixture server's port, once it runs


def refused(url: str, policy: MediaPolicy, *words: str) -> str:
    """The message of the 400 load_image raises; it names the part and holds every word given."""
    with pytest.raises(InvalidRequestError) as info:
        load_image(url, policy, param=PARAM)
    err = info.value
    assert err.param == PARAM
    message = str(err)
    for word in words:
        assert word in message, message
    # No address, port, path or stack trace: only what is wrong with the picture or the URL.
    for secret in ("127.0.0.1", "10.0.0.1", "169.254", "Traceback", "/tmp", "secret", "Errno", *SECRETS):
        assert secret not in message, message
    return message


@pytest.mark.parametrize(
    ("fmt", "mime"), [("PNG", "image/png"), ("JPEG", "image/jpeg"), ("WEBP", "image/webp")]
)
def test_data_url_formats_decode(fmt, mime):
    lossless = fmt != "JPEG"
    got = load_image(data_url(encoded(fmt), mime), MediaPolicy(), param=PARAM)
    assert got.image.mode == "RGB" and got.image.size == (24, 16)
    if lossless and fmt == "PNG":
        assert got.image.tobytes() == picture().tobytes()


def test_format_is_told_by_bytes_not_the_declared_mime():
    # A PNG declared as JPEG decodes as the PNG it is; a GIF declared as PNG is refused as a GIF.
    assert load_image(data_url(encoded("PNG"), "image/jpeg"), MediaPolicy(), param=PARAM).image.size == (
        24,
        16,
    )
    refused(data_url(encoded("GIF"), "image/png"), MediaPolicy(), "GIF", "not supported")
    refused(data_url(encoded("BMP")), MediaPolicy(), "BMP", "not supported")
    refused(data_url(b"hello, not a picture"), MediaPolicy(), "not supported")


def test_content_hash_follows_pixels_not_encoding():
    png = load_image(data_url(encoded("PNG")), MediaPolicy(), param=PARAM)
    webp_lossless = encoded_webp_lossless()
    again = load_image(data_url(webp_lossless, "image/webp"), MediaPolicy(), param=PARAM)
    other = load_image(data_url(encoded("PNG", seed=1)), MediaPolicy(), param=PARAM)
    assert png.content_hash == again.content_hash == content_hash(picture())
    assert png.content_hash != other.content_hash


def encoded_webp_lossless() -> bytes:
    import io

    buf = io.BytesIO()
    picture().save(buf, format="WEBP", lossless=True)
    return buf.getvalue()


def test_corrupt_truncated_and_bad_base64():
    refused(data_url(corrupt_png()), MediaPolicy(), "corrupt or truncated")
    refused(data_url(truncated("PNG")), MediaPolicy(), "corrupt or truncated")
    refused(data_url(truncated("JPEG")), MediaPolicy(), "corrupt or truncated")
    refused("data:image/png;base64,@@@not base64@@@", MediaPolicy(), "base64")
    refused("data:image/png,rawbytes", MediaPolicy(), "base64")
    refused(data_url(b""), MediaPolicy(), "empty")


def test_huge_header_refused_before_decoding():
    data = huge_png_header(50_000, 50_000)
    assert len(data) < 200  # the whole "image" is its header: nothing of 7.5 GB is ever allocated
    refused(data_url(data), MediaPolicy(), "too large", "50000x50000")
    # fd's own cap bites well below Pillow's bomb guard.
    refused(data_url(encoded("PNG", size=(40, 30))), MediaPolicy(max_pixels=1000), "too large", "40x30")


def test_huge_jpeg_and_webp_headers_refused_before_decoding():
    import struct

    jpeg = bytearray(encoded("JPEG"))
    sof = jpeg.index(b"\xff\xc0")  # baseline start of frame: length, precision, height, width
    jpeg[sof + 5 : sof + 9] = struct.pack(">HH", 40_000, 30_000)
    refused(data_url(bytes(jpeg), "image/jpeg"), MediaPolicy(), "too large", "30000x40000")
    webp = bytearray(encoded("WEBP"))
    assert webp[12:16] == b"VP8 "  # lossy: 14-bit width and height in the frame header
    webp[26:30] = struct.pack("<HH", 16_000, 16_000)
    refused(data_url(bytes(webp), "image/webp"), MediaPolicy(), "too large", "16000x16000")


def test_byte_cap_on_data_urls():
    refused(data_url(encoded("PNG")), MediaPolicy(max_bytes=100), "larger than 100 bytes")


def test_unknown_scheme():
    refused("ftp://example.com/a.png", MediaPolicy(), "data: URL")


# ---------------- local files ----------------


def test_local_files_only_under_the_allowed_path(tmp_path):
    root = tmp_path / "media"
    root.mkdir()
    (root / "ok.png").write_bytes(encoded("PNG"))
    outside = tmp_path / "secret.png"
    outside.write_bytes(encoded("PNG"))
    (root / "escape.png").symlink_to(outside)
    (root / "sub").mkdir()
    policy = MediaPolicy(allowed_local_path=str(root))

    assert load_image(f"file://{root}/ok.png", policy, param=PARAM).image.size == (24, 16)
    assert load_image(str(root / "ok.png"), policy, param=PARAM).image.size == (24, 16)
    # Off by default; outside the folder, through a symlink, through "..", a folder, a missing file.
    refused(f"file://{root}/ok.png", MediaPolicy(), "--allowed-local-media-path")
    refused(f"file://{outside}", policy, "--allowed-local-media-path")
    refused(f"file://{root}/escape.png", policy, "--allowed-local-media-path")
    refused(f"file://{root}/../secret.png", policy, "--allowed-local-media-path")
    refused(f"file://{root}/sub", policy, "regular file")
    refused(f"file://{root}/missing.png", policy, "regular file")
    refused(f"file://otherhost{root}/ok.png", policy, "host")
    if os.path.exists("/dev/zero"):
        dev = root / "zero.png"
        dev.symlink_to("/dev/zero")
        refused(f"file://{dev}", policy, "regular file")


def test_symlinked_allowed_folder_still_serves_its_files(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "ok.png").write_bytes(encoded("PNG"))
    (tmp_path / "link").symlink_to(real)
    policy = MediaPolicy(allowed_local_path=str(tmp_path / "link"))
    assert load_image(f"file://{tmp_path}/link/ok.png", policy, param=PARAM).image.size == (24, 16)


# ---------------- http(s) ----------------


@pytest.fixture(scope="module")
def fixture_server():
    with FixtureServer() as s:
        SECRETS.append(f":{s.httpd.server_address[1]}")
        yield s
        SECRETS.clear()


def http_policy(**kw) -> MediaPolicy:
    values = {
        "allowed_domains": ("127.0.0.1", "10.0.0.1", "169.254.169.254"),
        "allow_loopback_first_hop": True,
        "timeout_s": 3.0,
    }
    values.update(kw)
    return MediaPolicy(**values)


def test_http_good_pictures(fixture_server):
    for path in ("/img.png", "/img.jpg", "/img.webp"):
        got = load_image(fixture_server.url(path), http_policy(), param=PARAM)
        assert got.image.size == (24, 16)


def test_http_host_must_be_allowed(fixture_server):
    url = fixture_server.url("/img.png")
    refused(url, http_policy(allowed_domains=("images.example.com",)), "--allowed-media-domains")
    refused(url, MediaPolicy(), "--allowed-media-domains")  # off by default


def test_domain_matching_is_exact():
    policy = MediaPolicy(allowed_domains=("Images.Example.com", "[::1]"))
    assert policy.domain_allowed("images.example.com") and policy.domain_allowed("images.example.com.")
    assert policy.domain_allowed("::1")
    assert not policy.domain_allowed("evil.images.example.com")
    assert not policy.domain_allowed("images.example.com.evil.org")


def test_loopback_refused_without_the_test_allowance(fixture_server):
    refused(fixture_server.url("/img.png"), http_policy(allow_loopback_first_hop=False), "non-public")


@pytest.mark.parametrize("path", ["/to-loopback", "/to-private", "/to-link-local"])
def test_redirects_to_non_public_addresses(fixture_server, path):
    refused(fixture_server.url(path), http_policy(), "non-public")


def test_redirect_to_a_host_not_allowed(fixture_server):
    refused(fixture_server.url("/to-private"), http_policy(allowed_domains=("127.0.0.1",)), "not allowed")


def test_too_many_redirects(fixture_server):
    # /loop redirects to itself: the second hop is loopback, refused before the count runs out...
    refused(fixture_server.url("/loop"), http_policy(), "non-public")
    # ...and with no redirects allowed at all, the first redirect is one too many.
    refused(fixture_server.url("/loop"), http_policy(max_redirects=0), "redirects more than 0")


def test_bad_bodies_over_http(fixture_server):
    refused(fixture_server.url("/img.gif"), http_policy(), "GIF")
    refused(fixture_server.url("/corrupt.png"), http_policy(), "corrupt or truncated")
    refused(fixture_server.url("/truncated.png"), http_policy(), "corrupt or truncated")
    refused(fixture_server.url("/huge.png"), http_policy(), "too large", "50000x50000")
    refused(fixture_server.url("/gzip"), http_policy(), "compressed")
    refused(fixture_server.url("/missing"), http_policy(), "HTTP 404")


def test_endless_body_stops_at_the_byte_cap(fixture_server):
    refused(fixture_server.url("/endless"), http_policy(max_bytes=1 << 20), "larger than")


def test_stalled_body_stops_at_the_timeout(fixture_server):
    # The fixture would wait 30 s; the client's one deadline ends the fetch.
    refused(fixture_server.url("/stall"), http_policy(timeout_s=0.5), "longer than 0.5 s")


def test_connection_refused_names_no_address():
    from image_fixtures import FixtureServer as _S

    with _S() as s:
        url = s.url("/img.png")
    refused(url, http_policy(), "could not be fetched")


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("8.8.8.8", True),
        ("2606:4700:4700::1111", True),
        ("127.0.0.1", False),
        ("10.1.2.3", False),
        ("172.16.0.1", False),
        ("192.168.1.1", False),
        ("169.254.169.254", False),
        ("100.64.0.1", False),
        ("0.0.0.0", False),
        ("224.0.0.1", False),
        ("240.0.0.1", False),
        ("::1", False),
        ("fe80::1%eth0", False),
        ("fc00::1", False),
        ("::ffff:127.0.0.1", False),
        ("::ffff:10.0.0.1", False),
    ],
)
def test_public_addresses(address, public):
    from fdcli_engine.multimodal.media_fetch import is_public

    assert is_public(address) is public


def test_a_name_that_resolves_to_loopback_is_refused():
    # "localhost" is allowed by name, but every address it resolves to is checked.
    refused("http://localhost:9/img.png", MediaPolicy(allowed_domains=("localhost",)), "non-public")


def test_a_host_name_is_fetched_at_its_checked_address(fixture_server):
    # By name: the connection goes to an address the check saw (each in turn, e.g. ::1 then 127.0.0.1),
    # and the Host header still carries the name the URL gave.
    from fdcli_engine.multimodal.media_fetch import fetch_bytes

    port = fixture_server.httpd.server_address[1]
    policy = http_policy(allowed_domains=("localhost",))
    assert fetch_bytes(f"http://localhost:{port}/host", policy, param=PARAM) == f"localhost:{port}".encode()
    assert load_image(f"http://localhost:{port}/img.png", policy, param=PARAM).image.size == (24, 16)
