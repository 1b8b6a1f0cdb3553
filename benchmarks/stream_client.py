"""A light streaming-completion client for the serving benchmarks: one HTTP/1.1 request on a raw asyncio
connection, the chunked SSE body parsed by hand, every stream checked.

Why not httpx: the benchmark client runs on the same cores as the server it measures, and httpx spends
about 0.3 ms of CPU per streamed token (its response machinery and line iterator), as much as the server's
front end, which skews the comparison with the in-process engine against the server. This one reads the
socket in large pieces and decodes each event with msgspec.

Nothing is skipped: every event is parsed, its token ids counted, and a stream passes only if it ends with
a finish_reason, then `data: [DONE]`, carries no error event, and (when asked) has exactly the expected
number of tokens. Anything else raises StreamError.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from urllib.parse import urlsplit

import msgspec

_decoder = msgspec.json.Decoder()


class StreamError(Exception):
    """The server's stream was not a complete, well-formed, error-free completion stream."""


async def stream_completion(
    url: str, path: str, body: dict, expected_tokens: int | None = None, headers: dict | None = None
) -> int:
    """POST `body` (with "stream": true) to `url + path`; returns the number of output tokens streamed
    (the `token_ids` of every choice, so the request needs "return_token_ids": true)."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
    try:
        payload = msgspec.json.encode(body)
        head = [f"POST {path} HTTP/1.1", f"Host: {parts.netloc}", "Content-Type: application/json"]
        head += [f"Content-Length: {len(payload)}", "Connection: close"]
        head += [f"{k}: {v}" for k, v in (headers or {}).items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
        status, response_headers = await _read_head(reader)
        if status != 200:
            raise StreamError(f"server answered {status}: {(await reader.read(300))!r}")
        if response_headers.get("transfer-encoding", "").lower() != "chunked":
            raise StreamError(f"expected a chunked SSE body, got headers {response_headers}")
        return _check_events(await _read_chunked(reader), expected_tokens)
    finally:
        writer.close()


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    raw = await reader.readuntil(b"\r\n\r\n")
    lines = raw.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        if line:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
    return status, headers


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    """The whole chunked body: the events are parsed once the stream has ended, so receiving stays as
    cheap as reading the socket (the same bytes are parsed either way)."""
    body = bytearray()
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";", 1)[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")  # the empty trailer
            return bytes(body)
        body += await reader.readexactly(size)
        if await reader.readexactly(2) != b"\r\n":
            raise StreamError("malformed chunked encoding")


def _check_events(body: bytes, expected_tokens: int | None) -> int:
    if not body.endswith(b"\n\n"):
        raise StreamError(f"the stream ends mid-event: {body[-200:]!r}")
    events = body[:-2].split(b"\n\n")
    if events[-1] != b"data: [DONE]":
        raise StreamError(f"the stream does not end with [DONE]: {events[-1][:300]!r}")
    tokens, finish = 0, None
    for event in events[:-1]:
        if not event.startswith(b"data: {"):
            raise StreamError(f"unexpected event {event[:300]!r}")
        chunk = _decoder.decode(event[6:])
        if "error" in chunk:
            raise StreamError(f"error event: {chunk['error']}")
        for choice in chunk["choices"]:
            tokens += len(choice.get("token_ids") or [])
            finish = choice.get("finish_reason") or finish
    if finish is None:
        raise StreamError("no chunk carried a finish_reason")
    if expected_tokens is not None and tokens != expected_tokens:
        raise StreamError(f"streamed {tokens} tokens, expected {expected_tokens}")
    return tokens


def run(coro):
    """asyncio.run on uvloop's event loop when it is installed (less CPU per wake-up: one per token at
    concurrency 1), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(proc: subprocess.Popen, url: str, name: str, seconds: float, path: str = "/ready") -> None:
    """Polls `url` + `path` until it answers 200; exits (killing `proc`) if it dies or `seconds` pass."""
    import httpx

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}{path}", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"{name} exited with {proc.returncode}")
        time.sleep(0.25)
    proc.kill()
    raise SystemExit(f"{name} did not become ready")
