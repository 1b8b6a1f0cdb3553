"""The HTTP framing guard (http_guard.py) in front of both uvicorn protocols fd may use, httptools and
h11, served in-process with fd's uvicorn_config and a small ASGI app, driven over raw sockets.

The same cases run against a real `fd serve` in test_http_framing.py; here each runs on both parsers.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest
import uvicorn
from fd_server import read_until_closed

from fdcli_engine.entrypoints.openai.app_state import ServerArgs
from fdcli_engine.entrypoints.openai.http_guard import end_of_head
from fdcli_engine.entrypoints.openai.launcher import uvicorn_config

BOUND = 30.0  # generous: a case that should close does so well before this


async def app(scope, receive, send):
    """POST: echoes the body's length; GET /stream: three chunks; else an empty 200."""
    body, more = b"", scope["method"] == "POST"
    while more:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return
        body += msg.get("body", b"")
        more = msg.get("more_body", False)
    out = str(len(body)).encode()
    if scope["path"] != "/stream":
        headers = [(b"content-length", str(len(out)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        return await send({"type": "http.response.body", "body": out})
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}
    )
    for i in range(3):
        await send({"type": "http.response.body", "body": f"data: {i}\n\n".encode(), "more_body": True})
        await asyncio.sleep(0.05)
    await send({"type": "http.response.body", "body": b""})


def _protocols():
    from uvicorn.protocols.http.h11_impl import H11Protocol

    out = [pytest.param(H11Protocol, id="h11")]
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return out
    return [*out, pytest.param(HttpToolsProtocol, id="httptools")]


class Running:
    def __init__(self, protocol, **limits):
        args = ServerArgs(**limits)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn_config(app, args, protocol))
        self.server.config.log_level = "critical"
        self.thread = threading.Thread(
            target=lambda: asyncio.run(self.server.serve([self.sock])), daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + BOUND
        while not self.server.started:
            assert time.monotonic() < deadline
            time.sleep(0.02)

    def connect(self) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=BOUND)
        return s

    def stop(self):
        self.server.should_exit = True
        self.thread.join(BOUND)
        self.sock.close()


@pytest.fixture(params=_protocols())
def serve(request):
    running = []

    def start(**limits):
        running.append(Running(request.param, **limits))
        return running[-1]

    yield start
    for r in running:
        r.stop()


def read_response(s: socket.socket) -> bytes:
    """One response with a content-length, on a connection that stays open."""
    raw = b""
    while b"\r\n\r\n" not in raw:
        raw += s.recv(65536)
    head, _, body = raw.partition(b"\r\n\r\n")
    length = int(
        next(v for k, _, v in (h.partition(b": ") for h in head.split(b"\r\n")) if k == b"content-length")
    )
    while len(body) < length:
        body += s.recv(65536)
    return raw.partition(b"\r\n\r\n")[0] + b"\r\n\r\n" + body


def status_and_body(raw: bytes) -> tuple[int, bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def request(srv: Running, raw: bytes) -> tuple[int, bytes]:
    with srv.connect() as s:
        s.sendall(raw)
        return status_and_body(read_until_closed(s))


GET = b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n"


def test_end_of_head_finds_the_blank_line():
    assert end_of_head(b"GET / HTTP/1.1\r\nA: b\r\n\r\nBODY") == 24
    assert end_of_head(b"GET / HTTP/1.1\nA: b\n\nBODY") == 21
    assert end_of_head(b"GET / HTTP/1.1\r\nA: b\r\n") == -1


def test_normal_requests_and_streams_pass(serve):
    srv = serve()
    assert request(srv, GET + b"\r\n") == (200, b"0")
    assert request(
        srv, b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello"
    ) == (
        200,
        b"5",
    )
    status, body = request(srv, b"GET /stream HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    assert status == 200 and all(f"data: {i}".encode() in body for i in range(3))
    # Keep-alive: two requests on one connection, the second after the first's response.
    with srv.connect() as s:
        for _ in range(2):
            s.sendall(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nhi")
            assert status_and_body(read_response(s)) == (200, b"2")


def test_head_over_the_size_cap_is_431(serve):
    srv = serve(h11_max_incomplete_event_size=64 << 10)
    assert request(srv, GET + b"x-big: " + b"a" * (60 << 10) + b"\r\n\r\n")[0] == 200
    status, body = request(srv, GET + b"x-big: " + b"a" * (200 << 10) + b"\r\n\r\n")
    assert status == 431
    assert "65536 bytes" in json.loads(body)["error"]["message"]


def test_head_that_never_ends_is_cut_at_the_cap(serve):
    """A client still sending its head after the cap reads the 431: the server shuts its write side and
    drops what follows (a lingering close) instead of resetting the connection."""
    srv = serve(h11_max_incomplete_event_size=64 << 10)
    with srv.connect() as s:
        s.sendall(GET + b"x-big: ")
        for _ in range(16):  # 1 MiB offered; the server stops parsing after 64 KiB
            s.sendall(b"a" * (64 << 10))
        raw = read_until_closed(s)
    assert status_and_body(raw)[0] == 431


def test_too_many_headers_is_431(serve):
    srv = serve(h11_max_header_count=20)
    few = b"".join(b"x-h%d: v\r\n" % i for i in range(18))
    many = b"".join(b"x-h%d: v\r\n" % i for i in range(21))
    assert request(srv, GET + few + b"\r\n")[0] == 200  # 20 headers with host and connection
    status, body = request(srv, GET + many + b"\r\n")
    assert status == 431
    assert json.loads(body)["error"]["message"] == "the request has more than 20 headers"


def test_slow_head_gets_408_and_is_closed(serve):
    srv = serve(timeout_request_header=1.0)
    with srv.connect() as s:
        got = b""
        start = time.monotonic()
        for byte in GET:  # one byte every 0.2 s: the head would take 8 s
            try:
                s.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                break
            s.settimeout(0.2)
            try:
                got = s.recv(65536)
            except TimeoutError:
                continue
            break
        s.settimeout(BOUND)
        got += read_until_closed(s)
    assert time.monotonic() - start < BOUND
    assert status_and_body(got)[0] == 408


def test_silent_connection_is_closed_after_the_head_timeout(serve):
    srv = serve(timeout_request_header=0.5)
    with srv.connect() as s:
        status, body = status_and_body(read_until_closed(s))
    assert status == 408 and b"request head" in body


def test_short_body_gets_408_and_is_closed(serve):
    srv = serve(timeout_request_body=0.5)
    with srv.connect() as s:
        s.sendall(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\nonly part")
        status, body = status_and_body(read_until_closed(s))
    assert status == 408
    assert json.loads(body)["error"]["message"] == "the request body was not received within 0.5 s"


def test_idle_connections_beyond_the_bound_are_closed(serve):
    srv = serve(max_connections=4)
    idle = [srv.connect() for _ in range(4)]
    time.sleep(0.2)  # the server accepts the four before the next one
    assert request(srv, GET + b"\r\n") == (200, b"0")  # evicts the longest-idle one
    closed = 0
    for s in idle:
        s.settimeout(0.5)
        try:
            closed += s.recv(1) == b""
        except TimeoutError:
            pass
        s.close()
    assert closed >= 1


def test_new_connection_is_refused_when_all_are_busy(serve):
    srv = serve(max_connections=2, timeout_request_body=BOUND)
    busy = [srv.connect() for _ in range(2)]
    for s in busy:  # a request in progress each: headers in, body outstanding
        s.sendall(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\n")
    time.sleep(0.2)
    status, body = request(srv, GET + b"\r\n")
    assert status == 503 and b"limit of 2 connections" in body
    for s in busy:  # the busy requests still finish
        s.sendall(b"0123456789")
        assert status_and_body(read_response(s)) == (200, b"10")
        s.close()


def test_no_websocket_protocol_can_take_a_socket_past_the_guard():
    """An Upgrade would hand the transport to uvicorn's WebSocket protocol, outside the guard; fd has no
    WebSocket route, so none is configured even when `websockets` is installed."""
    config = uvicorn_config(app, ServerArgs())
    config.load()
    assert config.ws_protocol_class is None
    assert config.http_protocol_class.inner_class.__name__ in ("HttpToolsProtocol", "H11Protocol")


def test_open_file_limit_is_raised_to_fit_the_connections():
    import resource

    from fdcli_engine.entrypoints.openai.http_guard import fit_open_files

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"hard open-file limit {hard} is too low to test raising the soft one")
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (512, hard))
        assert fit_open_files(1024, reserve=256) == 1024
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == 1280
        if hard != resource.RLIM_INFINITY:  # beyond the hard limit: what fits, not more
            assert fit_open_files(hard, reserve=256) == hard - 256
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
