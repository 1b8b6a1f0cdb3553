"""Issue #28 item 4, HTTP framing (vLLM's CVE-2025-48956 class): a real `fd serve` (tiny model) caps the
request head's size and header count (431), closes a connection whose head or body does not arrive in
time (408), and bounds its open connections, while a normal stream and /health keep working.

Raw sockets: the cases are malformed or slow on purpose, which no HTTP client library sends. Waits are
bounded by BOUND; nothing asserts how fast the server is beyond "closed before BOUND".
"""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest
from fd_server import read_until_closed, start_server

BOUND = 30.0
MAX_CONNECTIONS = 6


@pytest.fixture(scope="module")
def srv(tiny_model, tmp_path_factory):
    server = start_server(
        tiny_model,
        tmp_path_factory.mktemp("framing"),
        "--h11-max-incomplete-event-size",
        str(64 << 10),
        "--h11-max-header-count",
        "32",
        "--timeout-request-header",
        "1",
        "--timeout-request-body",
        "1",
        "--max-connections",
        str(MAX_CONNECTIONS),
        "--served-model-name",
        "tiny",
    )
    yield server
    assert server.stop() == 0, server.log.read_text()[-3000:]


def connect(srv) -> socket.socket:
    return socket.create_connection(("127.0.0.1", srv.port), timeout=BOUND)


def error_of(raw: bytes) -> tuple[int, dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)["error"]


def head(srv, *extra: bytes) -> bytes:
    lines = [b"GET /v1/models HTTP/1.1", b"host: x", f"authorization: Bearer {srv.api_key}".encode(), *extra]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def send(srv, raw: bytes) -> bytes:
    with connect(srv) as s:
        try:
            s.sendall(raw)
        except (BrokenPipeError, ConnectionResetError):
            pass
        return read_until_closed(s)


def test_big_request_header_is_431(srv):
    ok = send(srv, head(srv, b"x-pad: " + b"a" * (32 << 10), b"connection: close"))
    assert ok.startswith(b"HTTP/1.1 200")
    status, err = error_of(send(srv, head(srv, b"x-pad: " + b"a" * (1 << 20))))
    assert status == 431
    assert err["message"] == f"the request head exceeds the limit of {64 << 10} bytes"
    assert err["type"] == "invalid_request_error"


def test_too_many_headers_is_431(srv):
    ok = send(srv, head(srv, *(b"x-h%d: v" % i for i in range(28)), b"connection: close"))
    assert ok.startswith(b"HTTP/1.1 200")  # 31 headers
    status, err = error_of(send(srv, head(srv, *(b"x-h%d: v" % i for i in range(10_000)))))
    assert status == 431 and err["message"] == "the request has more than 32 headers"


def test_slow_head_is_closed_after_the_head_timeout(srv):
    """One byte every 0.5 s: the head would take a minute; the server answers 408 and closes."""
    raw, got = head(srv), b""
    start = time.monotonic()
    with connect(srv) as s:
        s.settimeout(0.5)
        for byte in raw:
            try:
                s.sendall(bytes([byte]))
                got = s.recv(65536)
                break
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
            assert time.monotonic() - start < BOUND
        s.settimeout(BOUND)
        got += read_until_closed(s)
    assert time.monotonic() - start < BOUND
    status, err = error_of(got)
    assert status == 408 and "request head" in err["message"]


def test_body_shorter_than_its_content_length_is_closed(srv):
    body = b'{"model": "tiny", "prompt": "hi"'
    raw = (
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        + f"authorization: Bearer {srv.api_key}\r\ncontent-length: {len(body) + 100}\r\n\r\n".encode()
        + body
    )
    status, err = error_of(send(srv, raw))
    assert status == 408
    assert err["message"] == "the request body was not received within 1 s"


def test_idle_connections_beyond_the_bound_are_closed_while_requests_and_streams_go_on(srv):
    client = srv.client()
    stream = client.completions.create(
        model="tiny", prompt="hello", max_tokens=24, stream=True, temperature=0
    )
    chunks = []
    reader = threading.Thread(target=lambda: chunks.extend(stream))
    reader.start()
    idle = [connect(srv) for _ in range(MAX_CONNECTIONS + 1)]
    try:
        with httpx.Client(base_url=srv.url, headers=srv.headers, timeout=BOUND) as http:
            assert http.get("/v1/models").json()["data"][0]["id"] == "tiny"
            assert httpx.get(f"{srv.url}/health", timeout=BOUND).status_code == 200
        # Each idle one is closed: evicted for a newer connection (closed without a word) or, if it
        # outlived the head timeout first, with a 408. One more than the bound: at least one evicted.
        endings = [read_until_closed(s) for s in idle]
        assert all(e == b"" or error_of(e)[0] == 408 for e in endings)
        assert endings.count(b"") >= 1
    finally:
        for s in idle:
            s.close()
    reader.join(BOUND)
    assert not reader.is_alive()
    assert chunks and chunks[-1].choices[0].finish_reason in ("length", "stop")
    # The stream ran alongside: same tokens as the same request without any idle connections.
    text = "".join(c.choices[0].text for c in chunks)
    again = client.completions.create(model="tiny", prompt="hello", max_tokens=24, temperature=0)
    assert text == again.choices[0].text


def test_a_stream_in_flight_survives_the_hostile_cases(srv):
    """The response of a stream is open (its first chunk read) while each hostile case runs beside it;
    it then ends normally with the tokens of the same request made alone."""
    client = srv.client()
    stream = iter(
        client.completions.create(model="tiny", prompt="hi", max_tokens=32, stream=True, temperature=0)
    )
    chunks = [next(stream)]
    assert error_of(send(srv, head(srv, b"x-pad: " + b"a" * (1 << 20))))[0] == 431
    assert error_of(send(srv, head(srv, *(b"x-h%d: v" % i for i in range(1000)))))[0] == 431
    short_body = head(srv, b"content-length: 9").replace(b"GET /v1/models", b"POST /v1/completions") + b"{"
    assert error_of(send(srv, short_body))[0] == 408
    assert error_of(send(srv, b"GET /v1/mod"))[0] == 408
    assert httpx.get(f"{srv.url}/health", timeout=BOUND).status_code == 200
    chunks += list(stream)
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")
    alone = client.completions.create(model="tiny", prompt="hi", max_tokens=32, temperature=0)
    assert "".join(c.choices[0].text for c in chunks) == alone.choices[0].text


def test_health_answers_after_the_hostile_cases(srv):
    assert httpx.get(f"{srv.url}/health", timeout=BOUND).status_code == 200
