"""An image fetched over http(s), within the server's MediaPolicy.

Each hop (the URL, then at most `max_redirects` redirects) is checked before it is sent: the host must be
in --allowed-media-domains and every address it resolves to must be public (no loopback, private,
link-local, shared, multicast, reserved or unspecified address). The request then goes to the address
that was checked (the Host header and TLS server name carry the host name), so a second DNS answer
cannot swap in another address. One deadline covers every hop, connect and read; the body is counted
as it streams and dropped at `max_bytes`. No proxy from the environment, no decompression.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from urllib.parse import urljoin, urlsplit

import httpx

from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.multimodal.media import MediaPolicy

_REDIRECTS = (301, 302, 303, 307, 308)


def _refuse(message: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param)


def is_public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not (ip.is_multicast or ip.is_reserved or ip.is_unspecified)


def _checked_addresses(host: str, port: int, policy: MediaPolicy, first_hop: bool, param: str) -> list[str]:
    """The addresses to connect to, in the resolver's order: every one `host` resolves to must be allowed."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        raise _refuse("the image URL's host could not be resolved", param) from None
    addresses = list(dict.fromkeys(info[4][0] for info in infos))
    if not addresses:
        raise _refuse("the image URL's host could not be resolved", param)
    for address in addresses:
        if is_public(address):
            continue
        if first_hop and policy.allow_loopback_first_hop and ipaddress.ip_address(address).is_loopback:
            continue
        raise _refuse(
            "the image URL leads to a loopback, private or otherwise non-public address, which is "
            "not fetched",
            param,
        )
    return addresses


def _hop_targets(url: str, policy: MediaPolicy, first_hop: bool, param: str) -> tuple[list[str], dict, dict]:
    """(the URL with each checked address as its host, headers, request extensions) for one hop."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise _refuse("an image URL (or its redirect) must be http:// or https://", param)
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        raise _refuse("the image URL is malformed", param) from None
    if not host or parts.username is not None or parts.password is not None:
        raise _refuse("the image URL must name a host and carry no credentials", param)
    if not policy.domain_allowed(host):
        raise _refuse(
            "the image URL's host is not allowed: the server fetches only from --allowed-media-domains",
            param,
        )
    port = port or (443 if scheme == "https" else 80)
    tail = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    targets = [
        f"{scheme}://{f'[{a}]' if ':' in a else a}:{port}{tail}"
        for a in _checked_addresses(host, port, policy, first_hop, param)
    ]
    default_port = port == (443 if scheme == "https" else 80)
    headers = {"Host": host if default_port else f"{host}:{port}", "Accept-Encoding": "identity"}
    extensions = {"sni_hostname": host} if scheme == "https" else {}
    return targets, headers, extensions


def fetch_bytes(url: str, policy: MediaPolicy, *, param: str) -> bytes:
    """The body at `url` after at most `policy.max_redirects` checked redirects."""
    deadline = time.monotonic() + policy.timeout_s
    with httpx.Client(trust_env=False, follow_redirects=False, verify=True) as client:
        for hop in range(policy.max_redirects + 1):
            targets, headers, extensions = _hop_targets(url, policy, hop == 0, param)
            location = _one_hop(client, targets, headers, extensions, deadline, policy, param)
            if isinstance(location, bytes):
                return location
            url = urljoin(url, location)
    raise _refuse(f"the image URL redirects more than {policy.max_redirects} times", param)


def _remaining(deadline: float, policy: MediaPolicy, param: str) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise _refuse(f"fetching the image took longer than {policy.timeout_s:g} s", param)
    return left


def _connect(client, targets, headers, extensions, deadline, policy: MediaPolicy, param: str):
    """The streamed response of the first checked address that accepts the connection."""
    for target in targets:
        timeout = httpx.Timeout(_remaining(deadline, policy, param))
        request = client.build_request("GET", target, headers=headers, timeout=timeout, extensions=extensions)
        try:
            return client.send(request, stream=True)
        except httpx.ConnectError:
            continue  # the next address of the same host (e.g. IPv4 after IPv6)
        except httpx.TimeoutException:
            raise _refuse(f"fetching the image took longer than {policy.timeout_s:g} s", param) from None
        except httpx.HTTPError:
            break
    raise _refuse("the image URL could not be fetched: the connection failed", param)


def _one_hop(client, targets, headers, extensions, deadline, policy: MediaPolicy, param: str) -> bytes | str:
    """The body (bytes), or the redirect's Location (str)."""
    response = _connect(client, targets, headers, extensions, deadline, policy, param)
    try:
        if response.status_code in _REDIRECTS:
            location = response.headers.get("location")
            if not location:
                raise _refuse("the image URL redirects without a location", param)
            return location
        if response.status_code != 200:
            raise _refuse(f"the image URL answered HTTP {response.status_code}", param)
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise _refuse("the image URL sent a compressed body, which is not accepted", param)
        return _read_capped(response, deadline, policy, param)
    finally:
        response.close()


def _read_capped(response, deadline: float, policy: MediaPolicy, param: str) -> bytes:
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > policy.max_bytes:
        raise _refuse(f"the image is larger than {policy.max_bytes} bytes", param)
    body = bytearray()
    try:
        for chunk in response.iter_raw():
            body += chunk
            if len(body) > policy.max_bytes:
                raise _refuse(f"the image is larger than {policy.max_bytes} bytes", param)
            _remaining(deadline, policy, param)
    except httpx.TimeoutException:
        raise _refuse(f"fetching the image took longer than {policy.timeout_s:g} s", param) from None
    except httpx.HTTPError:
        raise _refuse("the image URL could not be fetched: the connection broke", param) from None
    return bytes(body)
