"""The server address a client command was given (`fd chat` / `fd complete --url`, `fd bench serve
--base-url`): one rule for all of them, curl's. An address without a scheme is http://
(`localhost:8000/v1` → `http://localhost:8000/v1`); a scheme other than http or https is a usage
error naming the flag, where httpx would read `localhost:` as a scheme and print a garbled address.
The chat and completion clients take the API's base; an address with no path there means the server's
/v1, so `--url localhost:8000` reaches `fd serve` instead of 404ing on /models."""

from __future__ import annotations

from fdcli_engine.errors import ConfigError

SCHEMES = ("http", "https")


def server_url(value: str, flag: str) -> str:
    """`value` with http:// added when it names no scheme, without trailing slashes; ConfigError (one
    line, naming `flag`) for another scheme or an address without a host."""
    url = value.strip()
    if "://" not in url:
        url = "http://" + url
    scheme, _, rest = url.partition("://")
    if scheme.lower() not in SCHEMES:
        raise ConfigError(
            f"{flag} {value!r}: use an http:// or https:// address (e.g. http://127.0.0.1:8000/v1)"
        )
    if not rest.split("/", 1)[0]:
        raise ConfigError(f"{flag} {value!r} names no host (e.g. http://127.0.0.1:8000/v1)")
    return url.rstrip("/")


def api_base_url(value: str, flag: str) -> str:
    """server_url(value, flag), with /v1 appended when the address names no path."""
    url = server_url(value, flag)
    return url if "/" in url.partition("://")[2] else url + "/v1"
