"""Where an image part's URL may point, and `load_image`, which fetches and decodes it.

Sources, each off unless the server allows it (vLLM's flags):
- `data:<mime>;base64,<data>`: always accepted; the format is told by the bytes, not the mime type;
- `file://…` (or an absolute path): only under --allowed-local-media-path, symlinks resolved, regular
  files only;
- `http(s)://…`: only when the host is in --allowed-media-domains, every resolved address public
  (media_fetch.py).
Every failure is an InvalidRequestError naming the content part (`param`), with a message that carries
no address, port, path or stack trace.
"""

from __future__ import annotations

import base64
import binascii
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.multimodal.image_check import LoadedImage, decode_image

__all__ = ["LoadedImage", "MediaPolicy", "load_image"]

MAX_IMAGE_BYTES = 20 << 20  # an encoded image (data: URL payload, file, HTTP body)
MAX_IMAGE_PIXELS = 8192 * 8192  # width x height, read from the header before decoding
FETCH_TIMEOUT_S = 10.0  # one budget for every hop of an HTTP fetch


@dataclass(frozen=True)
class MediaPolicy:
    """What a server lets image URLs reach, and the caps on each image.

    `allow_loopback_first_hop` exists for tests only (their fixture server listens on 127.0.0.1): the
    first request of a fetch may then go to a loopback address; every redirect is still checked in
    full. No flag or request field sets it."""

    allowed_local_path: str | None = None
    allowed_domains: tuple[str, ...] = ()
    max_bytes: int = MAX_IMAGE_BYTES
    max_pixels: int = MAX_IMAGE_PIXELS
    timeout_s: float = FETCH_TIMEOUT_S
    max_redirects: int = 3
    allow_loopback_first_hop: bool = False

    def domain_allowed(self, host: str) -> bool:
        """Exact match, case-insensitive, a trailing dot and IPv6 brackets ignored."""

        def norm(h: str) -> str:
            return h.strip("[]").lower().rstrip(".")

        return any(norm(host) == norm(d) for d in self.allowed_domains)


def load_image(url: str, policy: MediaPolicy, *, param: str) -> LoadedImage:
    """The picture at `url` (data:, file:// or a path, http(s)://), decoded and checked."""
    if not isinstance(url, str) or not url:
        raise InvalidRequestError("the image URL is empty", param=param)
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "data":
        data = _data_url_bytes(url, policy, param)
    elif scheme in ("http", "https"):
        from fdcli_engine.multimodal.media_fetch import fetch_bytes

        data = fetch_bytes(url, policy, param=param)
    elif scheme == "file" or url.startswith("/"):
        data = _local_bytes(url, policy, param)
    else:
        raise InvalidRequestError(
            "the image URL must be a data: URL (base64), an http(s):// URL or a file:// URL", param=param
        )
    return decode_image(data, max_pixels=policy.max_pixels, param=param)


def _data_url_bytes(url: str, policy: MediaPolicy, param: str) -> bytes:
    header, sep, payload = url.partition(",")
    if not sep or not header.lower().endswith(";base64"):
        raise InvalidRequestError(
            "a data: URL must be base64-encoded (data:image/png;base64,...)", param=param
        )
    if len(payload) > (policy.max_bytes + 2) // 3 * 4 + 4:  # before decoding anything
        raise _too_many_bytes(policy, param)
    try:
        data = base64.b64decode(payload.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequestError("the data: URL is not valid base64", param=param) from None
    if len(data) > policy.max_bytes:
        raise _too_many_bytes(policy, param)
    return data


def _too_many_bytes(policy: MediaPolicy, param: str) -> InvalidRequestError:
    return InvalidRequestError(f"the image is larger than {policy.max_bytes} bytes", param=param)


def _local_bytes(url: str, policy: MediaPolicy, param: str) -> bytes:
    if policy.allowed_local_path is None:
        raise InvalidRequestError(
            "local files are not served: start the server with --allowed-local-media-path to allow "
            "files under one folder",
            param=param,
        )
    if url.lower().startswith("file:"):
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise InvalidRequestError("a file:// URL may not name a host", param=param)
        path = unquote(parts.path)
    else:
        path = url
    refused = InvalidRequestError(
        "the file is not a readable regular file under --allowed-local-media-path", param=param
    )
    try:
        root = Path(policy.allowed_local_path).resolve(strict=True)
        real = Path(path).resolve(strict=True)  # every symlink followed: the check is on the target
    except (OSError, RuntimeError, ValueError):
        raise refused from None
    if not real.is_relative_to(root):
        raise refused
    try:
        fd = os.open(real, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        raise refused from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a folder, a device, a FIFO...
            raise refused
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(policy.max_bytes + 1)
    except OSError:
        raise refused from None
    finally:
        os.close(fd)
    if len(data) > policy.max_bytes:
        raise _too_many_bytes(policy, param)
    return data
