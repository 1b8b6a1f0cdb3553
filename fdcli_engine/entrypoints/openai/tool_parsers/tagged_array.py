"""Formats that write every call of an answer as one JSON array of `{"name", "arguments"}` objects
after an opening tag (jamba.py, granite.py, phi4_mini_json.py):

    <tool_calls>[{"name": "get_weather", "arguments": {"city": "Paris"}}, ...]</tool_calls>

A subclass names its opening tags (`starts`, the first found is used), the closing tag (`end`, or
None when the array ends the answer) and whether the tag must open the answer (`at_start`). Content
is the text before the tag (None when empty); text after the array or the closing tag is not part of
any call and is left out. Anything after the tag that is not an array of calls (json_scan
.calls_from_array) leaves the whole answer as content. Arguments stream as they grow.
"""

from __future__ import annotations

from fdcli_engine.entrypoints.openai.parsed_output import ParsedOutput, new_call_id, new_tool_call
from fdcli_engine.entrypoints.openai.tool_parsers.json_scan import JsonCallScanner, calls_from_array


class TaggedArrayToolParser:
    starts: tuple[str, ...] = ()
    end: str | None = None
    at_start = False  # True: the tag (or the bare array) must open the answer
    reads_answer = True
    new_id = staticmethod(new_call_id)

    @property
    def start_tag(self) -> str:
        return self.starts[0]

    @property
    def tags(self) -> tuple[str, ...]:
        return (*self.starts, self.end) if self.end else self.starts

    def _tag_at(self, text: str) -> tuple[int, int]:
        """(where the tag begins, where the array begins) or (-1, -1)."""
        if self.at_start:
            body = text.lstrip()
            at = len(text) - len(body)
            for tag in self.starts:
                if body.startswith(tag):
                    return at, at + len(tag)
            return (at, at) if body.startswith("[") else (-1, -1)
        found = [(text.find(tag), tag) for tag in self.starts if tag in text]
        if not found:
            return -1, -1
        at, tag = min(found)
        return at, at + len(tag)

    def call_start(self, text: str) -> int:
        return self._tag_at(text)[0]

    def calls_region(self, text: str) -> str | None:
        """The array after the tag (streamed); None until it has begun."""
        at, body = self._tag_at(text)
        rest = text[body:].lstrip() if at != -1 else ""
        if self.end:
            rest = rest.partition(self.end)[0]
        return rest if rest.startswith("[") else None

    def new_scanner(self) -> JsonCallScanner:
        return JsonCallScanner(2)

    def extract(self, text: str) -> ParsedOutput:
        at, body = self._tag_at(text)
        if at == -1:
            return ParsedOutput(None, text)
        rest = text[body:]
        if self.end:
            rest = rest.partition(self.end)[0]
        found = _array(rest.strip(), trailing_ok=not self.at_start)
        if not found:
            return ParsedOutput(None, text)
        calls = [new_tool_call(name, args) for name, args in found]
        return ParsedOutput(None, text[:at].rstrip() or None, calls)


def _array(rest: str, trailing_ok: bool) -> list[tuple[str, str]] | None:
    """The calls of the array that opens `rest`; text after it is allowed only when `trailing_ok`."""
    if not rest.startswith("["):
        return None
    if not trailing_ok:
        return calls_from_array(rest)
    end = _array_end(rest)
    return None if end == -1 else calls_from_array(rest[:end])


def _array_end(text: str) -> int:
    """One past the bracket that closes the array opening `text`; -1 when it does not close."""
    depth, in_str, esc = 0, False, False
    for i, c in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
            if depth == 0:
                return i + 1
    return -1
