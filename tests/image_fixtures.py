"""Pictures and a hostile little HTTP server for the image-input tests (tests/multimodal, tests/server).

`FixtureServer` listens on 127.0.0.1 (a free port) on daemon threads and serves:
  /img.png, /img.jpg, /img.webp     a good picture;      /img.gif   a GIF (unsupported);
  /corrupt.png, /truncated.png      broken pictures;     /huge.png  a 50,000 x 50,000 PNG header;
  /to-loopback, /to-private, /to-link-local            a 302 to such an address;
  /loop                             a redirect to itself, forever;
  /endless                          a 200 whose body never ends (bytes as fast as they go);
  /stall                            a 200 that sends its headers and then nothing;
  /gzip                             a good PNG, gzip-encoded;   anything else: 404.
The two never-ending handlers stop once the client goes away or after 30 s, whichever comes first.
"""

from __future__ import annotations

import base64
import gzip
import io
import struct
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from PIL import Image


def picture(width: int = 24, height: int = 16, seed: int = 0) -> Image.Image:
    """A small RGB picture with a pattern (every pixel depends on its position and the seed)."""
    im = Image.new("RGB", (width, height))
    im.putdata(
        [
            ((x * 10 + seed) % 256, (y * 15) % 256, (x * y + 7 * seed) % 256)
            for y in range(height)
            for x in range(width)
        ]
    )
    return im


def encoded(fmt: str = "PNG", seed: int = 0, size=(24, 16)) -> bytes:
    buf = io.BytesIO()
    picture(*size, seed=seed).save(buf, format=fmt)
    return buf.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def _png_chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def huge_png_header(width: int = 50_000, height: int = 50_000) -> bytes:
    """A PNG whose IHDR states width x height (8-bit RGB), with one tiny IDAT and IEND: decoding it would
    need width * height * 3 bytes."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 64)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", ihdr)
        + _png_chunk(b"IDAT", idat)
        + _png_chunk(b"IEND", b"")
    )


def corrupt_png() -> bytes:
    """A PNG with its pixel data overwritten (the IDAT's checksum no longer matches)."""
    data = bytearray(encoded("PNG"))
    start = data.index(b"IDAT") + 8
    data[start : start + 16] = b"\x55" * 16
    return bytes(data)


def truncated(fmt: str = "PNG") -> bytes:
    data = encoded(fmt, size=(64, 48))
    return data[: len(data) // 2]


class _Handler(BaseHTTPRequestHandler):
    server_version = "fixture"

    def log_message(self, *args):  # quiet
        pass

    def _send(self, body: bytes, ctype: str = "image/png", extra: dict | None = None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _redirect(self, location: str) -> None:
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):  # noqa: N802 - http.server's name
        port = self.server.server_address[1]
        routes = {
            "/img.png": lambda: self._send(encoded("PNG")),
            "/img.jpg": lambda: self._send(encoded("JPEG"), "image/jpeg"),
            "/img.webp": lambda: self._send(encoded("WEBP"), "image/webp"),
            "/img.gif": lambda: self._send(encoded("GIF"), "image/png"),
            "/corrupt.png": lambda: self._send(corrupt_png()),
            "/truncated.png": lambda: self._send(truncated()),
            "/huge.png": lambda: self._send(huge_png_header()),
            "/gzip": lambda: self._send(gzip.compress(encoded("PNG")), extra={"Content-Encoding": "gzip"}),
            "/to-loopback": lambda: self._redirect(f"http://127.0.0.1:{port}/img.png"),
            "/to-private": lambda: self._redirect("http://10.0.0.1/img.png"),
            "/to-link-local": lambda: self._redirect("http://169.254.169.254/latest/meta-data"),
            "/loop": lambda: self._redirect("/loop"),
            "/host": lambda: self._send(self.headers.get("Host", "").encode(), "text/plain"),
            "/endless": self._endless,
            "/stall": self._stall,
        }
        route = routes.get(self.path)
        if route is None:
            self.send_error(404)
            return
        route()

    def _endless(self):
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.end_headers()
        chunk = encoded("PNG")[:8] + b"\x00" * 65528
        deadline = time.monotonic() + 30
        try:
            while time.monotonic() < deadline:
                self.wfile.write(chunk)
        except OSError:  # the client hung up: what the test expects
            pass

    def _stall(self):
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.end_headers()
        self.wfile.write(b"\x89PNG")
        self.wfile.flush()
        self.server.stop.wait(30)


class FixtureServer:
    """The server above on a free 127.0.0.1 port; `url(path)` names a route. Use as a context manager."""

    def __init__(self):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.stop = threading.Event()
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)
