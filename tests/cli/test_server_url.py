"""fdcli.server_url: the one rule for the server address of fd chat / fd complete --url and fd bench
serve --base-url."""

from __future__ import annotations

import pytest

from fdcli.server_url import api_base_url, server_url
from fdcli_engine.errors import ConfigError


@pytest.mark.parametrize(
    "value, url",
    [
        ("localhost:18123/v1", "http://localhost:18123/v1"),
        ("127.0.0.1:8000/", "http://127.0.0.1:8000"),
        ("[::1]:8000/v1", "http://[::1]:8000/v1"),
        ("http://h:1/v1/", "http://h:1/v1"),
        ("HTTPS://h/v1", "HTTPS://h/v1"),
    ],
)
def test_no_scheme_is_http(value, url):
    assert server_url(value, "--url") == url


@pytest.mark.parametrize("value, words", [("ftp://h/v1", "use an http://"), ("http:///v1", "names no host")])
def test_bad_address_names_the_flag(value, words):
    with pytest.raises(ConfigError) as e:
        server_url(value, "--base-url")
    assert str(e.value).startswith(f"--base-url {value!r}") and words in str(e.value)


@pytest.mark.parametrize(
    "value, url",
    [
        ("localhost:8000", "http://localhost:8000/v1"),
        ("http://h:1/", "http://h:1/v1"),
        ("h:1/v1", "http://h:1/v1"),
        ("https://h/api/v1/", "https://h/api/v1"),
    ],
)
def test_api_base_without_path_is_v1(value, url):
    assert api_base_url(value, "--url") == url
