"""The streaming transport of `fd bench serve` for plain-http servers: HTTP/1.1 on asyncio streams.

Why not httpx for the streams: the benchmark client usually shares the machine with the server it
measures, so its CPU per streamed token is taken from the server. httpx (h11's pure-Python parser, anyio,
its line iterator) spent more CPU per streamed token than fd's own front end (docs/engine-measurements.md);
this reads the socket in large pieces, undoes the chunked framing and splits lines in bulk.

Scope: exactly what an OpenAI streaming request needs. POST with a JSON body; a response framed by
Content-Length, chunked encoding, or the connection's close; keep-alive connections reused per pool
(a reused connection the server had already closed is retried once on a new one, before any byte of
the response). https, and any URL an environment proxy applies to, stay on httpx (`use_for`).
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

READ_SIZE = 1 << 16


class HTTPTransportError(Exception):
    """The connection failed or the server's response was not valid HTTP/1.1."""


def use_for(url: str) -> bool:
    """Whether this transport serves `url`: plain http with no environment proxy for its host."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        return False
    proxies = urllib.request.getproxies_environment()
    if not (proxies.get("http") or proxies.get("all")):
        return True
    return bool(urllib.request.proxy_bypass_environment(parts.hostname))


class _Body:
    """Incremental decoder of one response body: feed() bytes as read, get the payload bytes back."""

    def __init__(self, headers: dict[str, str]) -> None:
        self.chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        self.remaining = None if self.chunked or length is None else int(length)
        self.until_close = not self.chunked and self.remaining is None
        self.done = self.remaining == 0
        self._buf = bytearray()
        self._chunk_left = 0  # payload bytes left in the current chunk
        self._trailer = False

    def feed(self, data: bytes) -> bytes:
        if not self.chunked:
            if self.remaining is not None:
                data = data[: self.remaining]
                self.remaining -= len(data)
                self.done = self.remaining == 0
            return data
        self._buf += data
        out = bytearray()
        while not self.done:
            if self._chunk_left:
                take = min(self._chunk_left, len(self._buf))
                out += self._buf[:take]
                del self._buf[:take]
                self._chunk_left -= take
                if self._chunk_left:
                    break
                continue
            end = self._buf.find(b"\r\n")
            if end < 0:
                break
            line = bytes(self._buf[:end])
            del self._buf[: end + 2]
            if self._trailer:  # trailer fields until the empty line that ends the body
                self.done = line == b""
                continue
            if line == b"":  # the CRLF after a chunk's data
                continue
            try:
                size = int(line.split(b";", 1)[0], 16)
            except ValueError:
                raise HTTPTransportError(f"malformed chunked encoding: {line[:40]!r}") from None
            if size == 0:
                self._trailer = True
            self._chunk_left = size
        return bytes(out)


class Response:
    """The part of httpx's streaming response `fd bench` uses: status_code, aread(), aiter_lines()."""

    def __init__(self, reader: asyncio.StreamReader, status_code: int, headers: dict[str, str]) -> None:
        self._reader = reader
        self.status_code = status_code
        self.headers = headers
        self._body = _Body(headers)
        self.complete = self._body.done

    async def _pieces(self) -> AsyncIterator[bytes]:
        while not self._body.done:
            data = await self._reader.read(READ_SIZE)
            if not data:
                if self._body.until_close:
                    self._body.done = True
                    break
                raise HTTPTransportError("the server closed the connection mid-response")
            payload = self._body.feed(data)
            if payload:
                yield payload
        self.complete = True

    async def aread(self) -> bytes:
        return b"".join([piece async for piece in self._pieces()])

    async def aiter_lines(self) -> AsyncIterator[str]:
        """Lines without their terminators (LF, CRLF or CR, as SSE allows), decoded as UTF-8."""
        pending = b""
        async for piece in self._pieces():
            text = pending + piece
            # A CR at the very end may be the first half of a CRLF split across reads: keep it back.
            keep_cr = text.endswith(b"\r")
            if keep_cr:
                text = text[:-1]
            lines = text.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
            pending = lines.pop() + (b"\r" if keep_cr else b"")
            for line in lines:
                yield line.decode("utf-8", errors="replace")
        if pending.rstrip(b"\r"):
            yield pending.rstrip(b"\r").decode("utf-8", errors="replace")


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    while True:
        try:
            raw = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            raise ConnectionResetError("the server closed the connection before answering") from exc
        except asyncio.LimitOverrunError:
            raise HTTPTransportError("response head larger than 64 KiB") from None
        lines = raw.decode("latin-1").split("\r\n")
        try:
            version, status = lines[0].split(" ", 2)[:2]
            code = int(status)
        except ValueError:
            raise HTTPTransportError(f"not an HTTP response: {lines[0][:80]!r}") from None
        if not version.startswith("HTTP/1."):
            raise HTTPTransportError(f"not an HTTP/1.x response: {lines[0][:80]!r}")
        if code >= 200:  # 1xx (100 Continue, 103 Early Hints) precede the real answer
            break
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    if version == "HTTP/1.0" and headers.get("connection", "").lower() != "keep-alive":
        headers["connection"] = "close"
    return code, headers


class Pool:
    """Keep-alive HTTP/1.1 connections, reused across requests; usable as an async context manager."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]] = {}

    async def __aenter__(self) -> Pool:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for conns in self._idle.values():
            for _, writer in conns:
                writer.close()
        self._idle.clear()

    @asynccontextmanager
    async def stream(self, method: str, url: str, json: dict | None = None, headers: dict | None = None):
        parts = urlsplit(url)
        key = (parts.hostname, parts.port or 80)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        request = _encode_request(method, target, parts.netloc, json, headers or {})
        idle = self._idle.setdefault(key, [])
        while True:
            reused = bool(idle)
            reader, writer = idle.pop() if reused else await asyncio.open_connection(*key)
            try:
                writer.write(request)
                await writer.drain()
                status, response_headers = await _read_head(reader)
                break
            except ConnectionError:
                writer.close()
                if not reused:  # a fresh connection failed: a real error, not a stale keep-alive one
                    raise
            except BaseException:  # cancelled (timeout, Ctrl-C) or a malformed answer
                writer.close()
                raise
        response = Response(reader, status, response_headers)
        try:
            yield response
        finally:
            keep = response.complete and response_headers.get("connection", "").lower() != "close"
            if keep and not reader.at_eof():
                idle.append((reader, writer))
            else:
                writer.close()


def _encode_request(method: str, target: str, host: str, body: dict | None, headers: dict) -> bytes:
    payload = b"" if body is None else json.dumps(body).encode()
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", "Accept: */*", "User-Agent: fd-bench"]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload
