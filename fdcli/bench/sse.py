"""A small Server-Sent Events decoder for OpenAI-style streams.

Spec subset that matters for LLM servers (WHATWG "event stream interpretation"):
- lines end in LF, CRLF or CR (httpx's `aiter_lines` already splits on all three);
- `data:` lines append to the event's data buffer; several `data:` lines join with "\n";
- a blank line dispatches the event; a line starting with ":" is a comment (keep-alive);
- `event:`, `id:`, `retry:` are recorded or ignored; a field without ":" is a field with empty value;
- one optional space after the colon is stripped, no more.
Some servers omit the blank line before the end of the stream: `finish()` flushes what is pending.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SSEEvent:
    data: str
    event: str = "message"


class SSEDecoder:
    def __init__(self) -> None:
        self._data: list[str] = []
        self._event = ""

    def feed_line(self, line: str) -> SSEEvent | None:
        """Consume one line (without its terminator); return an event when the line completes one."""
        line = line.rstrip("\r\n")
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        # id / retry / unknown fields carry nothing a benchmark needs.
        return None

    def finish(self) -> SSEEvent | None:
        """End of stream: dispatch an event whose terminating blank line never came."""
        return self._dispatch()

    def _dispatch(self) -> SSEEvent | None:
        if not self._data:
            self._event = ""
            return None
        event = SSEEvent(data="\n".join(self._data), event=self._event or "message")
        self._data = []
        self._event = ""
        return event


def iter_events(lines) -> list[SSEEvent]:
    """Decode a finite iterable of lines (used by tests and for non-async callers)."""
    decoder = SSEDecoder()
    events = [e for e in map(decoder.feed_line, lines) if e is not None]
    tail = decoder.finish()
    if tail is not None:
        events.append(tail)
    return events
