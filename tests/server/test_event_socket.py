"""The core's events to the front end (event_socket.py): every frame arrives whole and in order however
the stream is split, large frames included, and a front end that stops reading fails the core's send
within its timeout instead of blocking it forever. The reference is the list of payloads sent."""

from __future__ import annotations

import os
import threading

import pytest

from fdcli_engine.api.event_socket import EventSender, FrameReader, listen

PAYLOADS = [b"", b"a", os.urandom(300), b"\x00" * 5, os.urandom(70_000), os.urandom(3)]


def _wire(payloads):
    return b"".join(len(p).to_bytes(4, "little") + p for p in payloads)


@pytest.mark.parametrize("piece", [1, 2, 3, 7, 4096, 1 << 20])
def test_frames_come_out_whole_and_in_order_however_split(piece):
    wire = _wire(PAYLOADS)
    reader = FrameReader()
    got = []
    for i in range(0, len(wire), piece):
        got += reader.feed(wire[i : i + piece])
    assert got == PAYLOADS


def test_one_whole_frame_per_read():
    reader = FrameReader()
    for p in PAYLOADS:
        assert reader.feed(_wire([p])) == [p]


def _accept_and_read(listener, into: list, done: threading.Event):
    listener.setblocking(True)
    conn, _ = listener.accept()
    reader = FrameReader()
    with conn:
        while data := conn.recv(1 << 16):
            into += reader.feed(data)
    done.set()


def test_sender_to_listener_over_a_real_socket(tmp_path):
    listener = listen(str(tmp_path / "events"))
    got: list[bytes] = []
    done = threading.Event()
    t = threading.Thread(target=_accept_and_read, args=(listener, got, done), daemon=True)
    t.start()
    sender = EventSender(str(tmp_path / "events"), timeout=10)
    sent = [os.urandom(n) for n in (10, 2_000_000, 0, 65_536, 65_537, 17)]
    for p in sent:
        sender.send(p)
    sender.close()
    assert done.wait(20)
    listener.close()
    assert got == sent


def test_a_front_end_that_stops_reading_times_the_send_out(tmp_path):
    listener = listen(str(tmp_path / "events"))
    sender = EventSender(str(tmp_path / "events"), timeout=0.3)
    try:
        with pytest.raises(TimeoutError):
            for _ in range(1000):  # the socket's buffers fill; then a send waits 0.3 s and fails
                sender.send(b"x" * (1 << 20))
    finally:
        sender.close()
        listener.close()


def test_a_sender_gets_an_error_once_the_front_end_is_gone(tmp_path):
    listener = listen(str(tmp_path / "events"))
    sender = EventSender(str(tmp_path / "events"), timeout=5)
    listener.setblocking(True)
    conn, _ = listener.accept()
    conn.close()
    listener.close()
    with pytest.raises(OSError):  # BrokenPipeError / ConnectionResetError, never a hang
        for _ in range(100):
            sender.send(b"y" * 4096)
    sender.close()
