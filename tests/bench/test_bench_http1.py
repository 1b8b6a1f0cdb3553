"""fd bench's plain-http streaming transport (fdcli/bench/http1.py) against a raw socket server that sends
exact bytes: every framing (chunked, Content-Length, close-delimited), bytes split at every boundary,
SSE line endings, keep-alive reuse, the retry of a stale keep-alive connection, and its errors."""

from __future__ import annotations

import asyncio

import pytest

from fdcli.bench import http1

SSE = b'data: {"a": 1}\n\ndata: {"b": "\xc3\xa9"}\r\n\r\n: comment\rdata: [DONE]\n\n'
LINES = ['data: {"a": 1}', "", 'data: {"b": "é"}', "", ": comment", "data: [DONE]", ""]


def chunked(payload: bytes, sizes: list[int]) -> bytes:
    out, i = b"", 0
    for n in sizes:
        piece = payload[i : i + n]
        i += n
        out += f"{len(piece):x};ext=1\r\n".encode() + piece + b"\r\n"
    assert i >= len(payload)
    return out + b"0\r\nX-Trailer: t\r\n\r\n"


def split_everywhere(data: bytes):
    """The same bytes fed whole, one byte at a time, and in two parts at every boundary."""
    yield [data]
    yield [data[i : i + 1] for i in range(len(data))]
    for cut in range(1, len(data)):
        yield [data[:cut], data[cut:]]


@pytest.mark.parametrize("sizes", [[len(SSE)], [1] * len(SSE), [5, 7, 200]])
def test_chunked_decoding_is_independent_of_how_the_bytes_arrive(sizes):
    wire = chunked(SSE, sizes)
    for parts in split_everywhere(wire):
        body = http1._Body({"transfer-encoding": "chunked"})
        got = b"".join(body.feed(p) for p in parts)
        assert got == SSE and body.done


def test_content_length_stops_at_the_length_and_close_delimited_reads_everything():
    body = http1._Body({"content-length": "4"})
    assert body.feed(b"ab") == b"ab" and not body.done
    assert body.feed(b"cdEXTRA") == b"cd" and body.done
    assert http1._Body({"content-length": "0"}).done
    body = http1._Body({})
    assert body.until_close and body.feed(b"xyz") == b"xyz" and not body.done


def test_malformed_chunk_size_is_a_transport_error():
    with pytest.raises(http1.HTTPTransportError, match="chunked"):
        http1._Body({"transfer-encoding": "chunked"}).feed(b"zz\r\n")


class FakeReader:
    def __init__(self, parts: list[bytes]) -> None:
        self.parts = list(parts)

    async def read(self, n: int) -> bytes:
        return self.parts.pop(0) if self.parts else b""


def test_lines_split_on_lf_crlf_and_cr_across_any_read_boundary():
    async def lines(parts):
        resp = http1.Response(FakeReader(parts), 200, {"content-length": str(len(SSE))})
        return [line async for line in resp.aiter_lines()]

    for parts in split_everywhere(SSE):
        assert asyncio.run(lines(parts)) == LINES, parts


class RawServer:
    """Answers each request on a connection with the next scripted response (bytes, or None to close
    the connection without answering); records how many connections were opened."""

    def __init__(self, responses: list[bytes | None], close_after_each: bool = False) -> None:
        self.responses = list(responses)
        self.close_after_each = close_after_each
        self.connections = 0
        self.requests: list[bytes] = []

    async def handle(self, reader, writer) -> None:
        self.connections += 1
        try:
            while self.responses:
                head = await reader.readuntil(b"\r\n\r\n")
                length = [
                    int(h.split(b":")[1])
                    for h in head.split(b"\r\n")
                    if h.lower().startswith(b"content-length")
                ]
                self.requests.append(head + await reader.readexactly(length[0] if length else 0))
                answer = self.responses.pop(0)
                if answer is None:
                    break
                writer.write(answer)
                await writer.drain()
                if self.close_after_each:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


def ok_response(payload: bytes) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        + chunked(payload, [3, 100])
    )


async def _serve_and_call(server: RawServer, calls):
    srv = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}/v1/completions?x=1"
    try:
        async with http1.Pool() as pool:
            return [await call(pool, url) for call in calls]
    finally:
        srv.close()


async def _lines(pool, url):
    async with pool.stream("POST", url, json={"prompt": "hi"}, headers={"Authorization": "Bearer k"}) as resp:
        return resp.status_code, [line async for line in resp.aiter_lines()]


def test_requests_reuse_one_keep_alive_connection_and_send_the_body_and_headers():
    server = RawServer([ok_response(SSE), ok_response(SSE)])
    results = asyncio.run(_serve_and_call(server, [_lines, _lines]))
    assert results == [(200, LINES), (200, LINES)]
    assert server.connections == 1
    first = server.requests[0]
    assert first.startswith(b"POST /v1/completions?x=1 HTTP/1.1\r\n")
    assert b"Authorization: Bearer k\r\n" in first and first.endswith(b'{"prompt": "hi"}')


def test_a_keep_alive_connection_the_server_closed_is_retried_once_on_a_new_one():
    # The server answers once per connection and closes it: the second request finds the pooled
    # connection dead and must transparently open a new one.
    server = RawServer([ok_response(SSE), ok_response(SSE)], close_after_each=True)
    results = asyncio.run(_serve_and_call(server, [_lines, _lines]))
    assert results == [(200, LINES), (200, LINES)] and server.connections == 2


def test_connection_close_and_http_1_0_are_not_reused():
    close = b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok"
    old = b"HTTP/1.0 200 OK\r\n\r\nold body"
    server = RawServer([close, old, ok_response(SSE)], close_after_each=True)
    results = asyncio.run(_serve_and_call(server, [_lines, _lines, _lines]))
    assert results == [(200, ["ok"]), (200, ["old body"]), (200, LINES)]


def test_error_status_body_is_readable():
    async def read(pool, url):
        async with pool.stream("POST", url, json={}) as resp:
            return resp.status_code, await resp.aread()

    answer = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 429 Too Many\r\ncontent-length: 9\r\n\r\nslow down"
    assert asyncio.run(_serve_and_call(RawServer([answer]), [read])) == [(429, b"slow down")]


def test_a_stream_cut_mid_body_and_a_refused_connection_are_errors():
    cut = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nda"
    with pytest.raises(http1.HTTPTransportError, match="mid-response"):
        asyncio.run(_serve_and_call(RawServer([cut], close_after_each=True), [_lines]))
    with pytest.raises(ConnectionResetError, match="before answering"):
        asyncio.run(_serve_and_call(RawServer([None]), [_lines]))
    with pytest.raises(http1.HTTPTransportError, match="not an HTTP"):
        asyncio.run(_serve_and_call(RawServer([b"SSH-2.0-x\r\n\r\n"]), [_lines]))

    async def refused():
        srv = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        srv.close()
        await srv.wait_closed()
        async with http1.Pool() as pool:
            await _lines(pool, f"http://127.0.0.1:{port}/")

    with pytest.raises(OSError):
        asyncio.run(refused())


def test_https_and_proxied_urls_stay_on_httpx(monkeypatch):
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert http1.use_for("http://127.0.0.1:8000")
    assert not http1.use_for("https://api.example.com")
    monkeypatch.setenv("http_proxy", "http://proxy:3128")
    assert not http1.use_for("http://10.0.0.5:8000")
    monkeypatch.setenv("no_proxy", "10.0.0.5")
    assert http1.use_for("http://10.0.0.5:8000")
