"""HTTP/1.1 framing limits in front of uvicorn's protocol (httptools or h11, one implementation).

`guarded_protocol(inner, limits)` returns an asyncio protocol class that owns the connection and feeds
every byte to an `inner` uvicorn protocol, after checking:

- the request head (request line + headers, up to the blank line) is at most `max_head_bytes` and holds
  at most `max_header_count` headers, counted on the raw bytes before any parser sees them: over either
  cap the client gets a 431 error object and the connection closes (the parser never buffers more);
- the head arrives within `head_timeout` seconds (from the connection's start, or from the first byte
  of a later request on a kept-alive connection) and the body within `body_timeout` seconds of the
  head's end: else a 408 error object when no response has started, and the connection closes;
- at most `max_connections` connections are open: one more evicts the connection that has been idle
  (no request in progress) the longest, or, when every connection is serving a request, is answered
  503 and closed. uvicorn's `limit_concurrency` is not used: it answers 503 only once a head is
  complete, so idle and half-open connections would still hold their sockets.

The phase (head or body) is read from the inner protocol's state after each feed: `inner.cycle` is the
request it parsed last (both uvicorn protocols keep it) and `cycle.more_body` turns false when its body
is complete. The guard never parses HTTP itself beyond finding the blank line that ends a head.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass

logger = logging.getLogger("fd.serve")
_REASONS = {408: "Request Timeout", 431: "Request Header Fields Too Large", 503: "Service Unavailable"}
LINGER_S = 2.0
WARN_EVERY_S = 10.0
_TYPES = {408: "invalid_request_error", 431: "invalid_request_error", 503: "service_unavailable"}


@dataclass(frozen=True)
class FramingLimits:
    max_head_bytes: int = 4 << 20  # vLLM's --h11-max-incomplete-event-size default
    max_header_count: int = 256  # vLLM's --h11-max-header-count default
    head_timeout: float = 30.0
    body_timeout: float = 120.0
    max_connections: int = 2048


def error_bytes(status: int, message: str) -> bytes:
    """A complete HTTP/1.1 response carrying an OpenAI error object, closing the connection."""
    body = json.dumps(
        {"error": {"message": message, "type": _TYPES[status], "param": None, "code": None}}
    ).encode()
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


def end_of_head(buf: bytes) -> int:
    """Index just past the blank line that ends a request head in `buf`, or -1. A bare LF line end is
    accepted as h11 accepts it."""
    ends = [i + 4 for i in (buf.find(b"\r\n\r\n"),) if i >= 0] + [
        i + 2 for i in (buf.find(b"\n\n"),) if i >= 0
    ]
    return min(ends, default=-1)


class ConnectionBook:
    """The open connections of one server, oldest first, for the `max_connections` bound."""

    def __init__(self, limit: int):
        self.limit = max(1, limit)
        self.open: dict[GuardedProtocol, None] = {}
        self._warned_at = float("-inf")

    def warn(self, now: float, message: str) -> None:
        """Log `message` at most once per WARN_EVERY_S: a flood of connections must not flood the log."""
        if now - self._warned_at >= WARN_EVERY_S:
            self._warned_at = now
            logger.warning(message)

    def admit(self, conn: GuardedProtocol) -> bool:
        if len(self.open) >= self.limit:
            idle = [c for c in self.open if c.idle]
            if not idle:
                return False
            victim = min(idle, key=lambda c: c.idle_since)
            self.warn(
                conn.loop.time(), f"connection limit {self.limit} reached: closing the longest-idle ones"
            )
            self.discard(victim)
            victim.close()
        self.open[conn] = None
        return True

    def discard(self, conn: GuardedProtocol) -> None:
        self.open.pop(conn, None)


class GuardedProtocol(asyncio.Protocol):
    inner_class: type
    limits: FramingLimits
    book: ConnectionBook

    def __init__(self, config, server_state, app_state, _loop=None):
        self.loop = _loop or asyncio.get_event_loop()
        self.inner = self.inner_class(
            config=config, server_state=server_state, app_state=app_state, _loop=_loop
        )
        self.transport: asyncio.Transport | None = None
        self.cycle = None  # the inner protocol's request seen last
        self.timer: asyncio.TimerHandle | None = None
        self.lingering = False  # an error was sent: input is dropped until the close
        self.idle_since = self.loop.time()
        self._reset_head()

    def _reset_head(self) -> None:
        self.in_head = True
        self.head_bytes = 0
        self.head_lines = 0
        self.tail = b""  # the last bytes seen of the head, for a blank line split across reads

    @property
    def idle(self) -> bool:
        """No request in progress: waiting for a head (none, or a partial one) after any response."""
        return self.in_head and (self.cycle is None or self.cycle.response_complete)

    # asyncio.Protocol

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.inner.connection_made(transport)
        if not self.book.admit(self):
            self.book.warn(self.loop.time(), f"connection limit {self.book.limit} reached, none idle: 503")
            self._respond(503, f"the server holds its limit of {self.book.limit} connections; retry later")
            return
        self._arm(self.limits.head_timeout, self._head_timed_out)

    def connection_lost(self, exc) -> None:
        self._cancel()
        self.book.discard(self)
        self.inner.connection_lost(exc)

    def eof_received(self):
        return None if self.lingering else self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def data_received(self, data: bytes) -> None:
        if self.lingering or self.transport.is_closing():
            return
        if self.in_head and not self._count_head(data):
            return
        self.inner.data_received(data)
        self._follow_inner()

    # the phases

    def _count_head(self, data: bytes) -> bool:
        """Add `data`'s head part to the counts; False (431 sent) when a cap is exceeded."""
        if self.head_bytes == 0 and self.timer is None:  # first byte of a kept-alive connection's request
            self._arm(self.limits.head_timeout, self._head_timed_out)
        buf = self.tail + data
        end = end_of_head(buf)
        part = data if end < 0 else data[: max(0, end - len(self.tail))]
        self.head_bytes += len(part)
        self.head_lines += part.count(b"\n")
        self.tail = buf[-3:]
        headers = self.head_lines - (2 if end >= 0 else 1)  # less the request line and the blank line
        lim = self.limits
        if headers > lim.max_header_count:
            self._respond(431, f"the request has more than {lim.max_header_count} headers")
            return False
        if self.head_bytes > lim.max_head_bytes:
            self._respond(431, f"the request head exceeds the limit of {lim.max_head_bytes} bytes")
            return False
        return True

    def _follow_inner(self) -> None:
        cycle = getattr(self.inner, "cycle", None)
        if cycle is not None and cycle is not self.cycle:  # the inner parser completed a new head
            self.cycle = cycle
            if cycle.more_body:
                self.in_head = False
                self._arm(self.limits.body_timeout, self._body_timed_out)
            else:
                self._await_head()
        elif not self.in_head and not cycle.more_body:
            self._await_head()

    def _await_head(self) -> None:
        """The request's bytes are all in; the next head's timer starts at its first byte (until then
        uvicorn's keep-alive timeout closes a connection left idle after its response)."""
        self._cancel()
        self._reset_head()
        self.idle_since = self.loop.time()

    def _head_timed_out(self) -> None:
        self.timer = None
        if not self.idle:  # a pipelined head waits while the response before it streams
            self._arm(self.limits.head_timeout, self._head_timed_out)
            return
        self._respond(408, f"the request head was not received within {self.limits.head_timeout:g} s")

    def _body_timed_out(self) -> None:
        self.timer = None
        if self.in_head:
            return
        flow = getattr(self.inner, "flow", None)
        if flow is not None and flow.read_paused:  # the server, not the client, holds the body back
            self._arm(self.limits.body_timeout, self._body_timed_out)
            return
        cycle = self.cycle
        msg = f"the request body was not received within {self.limits.body_timeout:g} s"
        if cycle.response_started:
            logger.warning("%s; closing the connection", msg)
            self.close()
            return
        cycle.disconnected = True  # the app's receive() now says http.disconnect and its send() is a no-op
        cycle.message_event.set()
        self._respond(408, msg)

    # helpers

    def _respond(self, status: int, message: str) -> None:
        """Send the error, then a lingering close: the write side shuts at once (the client reads the
        response and its end), and what the client still sends is read and dropped for up to LINGER_S.
        Closing at once would let the kernel answer those bytes with a reset that can destroy the
        response before the client reads it."""
        self._cancel()
        transport = self.transport
        if transport.is_closing():
            return
        transport.write(error_bytes(status, message))
        self.lingering = True
        if transport.can_write_eof():
            transport.write_eof()
        transport.resume_reading()
        self._arm(LINGER_S, self.close)

    def close(self) -> None:
        self._cancel()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def _arm(self, seconds: float, callback) -> None:
        self._cancel()
        self.timer = self.loop.call_later(seconds, callback)

    def _cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


def fit_open_files(max_connections: int, reserve: int = 256) -> int:
    """Raise the soft open-file limit so `max_connections` sockets fit beside the server's own files
    (`reserve`: model files, ZMQ sockets, logs), as far as the hard limit allows, as vLLM does at start.
    Returns the connections that fit; past it accept() would fail with EMFILE."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max_connections + reserve
    if soft != resource.RLIM_INFINITY and soft < want:
        soft = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    fits = max_connections if soft == resource.RLIM_INFINITY else min(max_connections, soft - reserve)
    if fits < max_connections:
        logger.warning(
            "--max-connections %d: the open-file limit (%d) leaves room for %d", max_connections, soft, fits
        )
    return fits


def guarded_protocol(inner: type, limits: FramingLimits) -> type[GuardedProtocol]:
    """A protocol class for uvicorn.Config(http=...): `inner` behind `limits`, with its own connection
    book (one per server: the --metrics-port server counts its connections apart)."""
    attrs = {"inner_class": inner, "limits": limits, "book": ConnectionBook(limits.max_connections)}
    return type(f"Guarded{inner.__name__}", (GuardedProtocol,), attrs)
