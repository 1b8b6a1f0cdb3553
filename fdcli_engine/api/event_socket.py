"""The engine core's events to the front end: length-prefixed frames over a Unix stream socket.

Why not ZMQ for this direction: the core sends one event per engine step and the front end wakes for
each. A ZMQ PUSH/PULL pair passes every message through an I/O thread in each process (core main
thread -> its I/O thread -> the socket -> the front end's I/O thread -> the front end's main thread),
two more thread wake-ups per token on cores the engine's OpenMP threads fill. Here the core's main
thread writes the socket and the front end's event loop reads it.

Frame: a 4-byte little-endian length, then that many bytes (one msgpack-encoded CoreEvent). The front
end listens; the core's loop connects once, and any other sender (a tensor-parallel watchdog thread
reporting a dead rank) connects its own socket, so frames of different senders never interleave.
"""

from __future__ import annotations

import contextlib
import socket
import struct

_HEADER = struct.Struct("<I")
SEND_TIMEOUT_S = 30.0  # a front end that stops reading fails the core's send after this long
SEND_BUFFER_BYTES = 4 << 20  # events a busy front end has not read yet (the OS may allow less)
RECV_BYTES = 1 << 18


def listen(path: str) -> socket.socket:
    """The front end's listening socket at `path` (non-blocking: accepted from the event loop)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(8)
    sock.setblocking(False)
    return sock


class EventSender:
    """The core's end: blocking sends, each bounded by SEND_TIMEOUT_S (TimeoutError past it)."""

    def __init__(self, path: str, timeout: float = SEND_TIMEOUT_S):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # A front end that falls behind for a while (a burst of work on its event loop) holds the core
        # back only once this much is unread: the send then waits, up to `timeout`.
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        self.sock.settimeout(timeout)
        self.sock.connect(path)

    def send(self, payload: bytes) -> None:
        header = _HEADER.pack(len(payload))
        if len(payload) <= 1 << 16:  # one write for the common small event
            self.sock.sendall(header + payload)
        else:  # no copy of a large one
            self.sock.sendall(header)
            self.sock.sendall(payload)

    def close(self) -> None:
        self.sock.close()


class FrameReader:
    """The front end's end of one connection: bytes in (any split), whole frames out, in order."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        if not self._buf and len(data) >= _HEADER.size:
            n = _HEADER.unpack_from(data)[0]
            if len(data) == _HEADER.size + n:  # exactly one whole frame: the usual case, no copy
                return [data[_HEADER.size :]]
        buf = self._buf
        buf += data
        frames = []
        start = 0
        while len(buf) - start >= _HEADER.size:
            n = _HEADER.unpack_from(buf, start)[0]
            end = start + _HEADER.size + n
            if len(buf) < end:
                break
            frames.append(bytes(buf[start + _HEADER.size : end]))
            start = end
        del buf[:start]
        return frames
