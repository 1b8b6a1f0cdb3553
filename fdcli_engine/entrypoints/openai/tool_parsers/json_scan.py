"""An incremental scanner for tool calls written as JSON objects: it reads text as it grows and says,
for each call object found so far, its name (once the name string is complete) and the raw source
text of its arguments value (growing while the value is open).

One scanner serves every JSON-argument format: a lone object (`call_depth` 1: hermes blocks,
llama3_json objects, a named tool_choice's arguments), or objects inside a top-level array
(`call_depth` 2: tool_choice "required", mistral's `[TOOL_CALLS][...]`). Text at depth 0 outside any
object is ignored (tags, separators), so a scanner can run over a whole region of tagged blocks.

Invariant: every `arguments` the scanner reports for a call is a prefix of what it reports later for
that call (characters are only appended; an open value's trailing whitespace is held back), so
streamed argument fragments add up to the final arguments. A string-valued arguments field (JSON
text inside a JSON string) is reported only when the string is complete, decoded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

NAME_KEYS = ("name",)
ARGS_KEYS = ("arguments", "parameters")


@dataclass
class ScannedCall:
    name: str | None = None
    args_start: int = -1  # where the arguments value begins in the text; -1: not seen yet
    args_end: int = -1  # one past its end; -1: still open
    args_str: str | None = None  # the decoded value when arguments is a JSON string
    closed: bool = False  # the call object's closing brace was read


class JsonCallScanner:
    def __init__(self, call_depth: int = 1, args_keys: tuple[str, ...] = ARGS_KEYS):
        self.call_depth = call_depth
        self.args_keys = args_keys
        self.text = ""
        self.calls: list[ScannedCall] = []
        self._pos = 0
        self._depth = 0
        self._in_str = False
        self._esc = False
        self._state = "key"  # at call depth: key, key_str, colon, value, in_value, after
        self._key: str | None = None
        self._start = 0  # start of the current key string or call-depth value

    def feed(self, more: str) -> list[ScannedCall]:
        self.text += more
        text, depth = self.text, self.call_depth
        for i in range(self._pos, len(text)):
            c = text[i]
            if self._in_str:
                if self._esc:
                    self._esc = False
                elif c == "\\":
                    self._esc = True
                elif c == '"':
                    self._in_str = False
                    if self._depth == depth:
                        if self._state == "key_str":
                            self._key = _loads(text[self._start : i + 1])
                            self._state = "colon"
                        elif self._state == "in_value":
                            self._end_value(i + 1)
                continue
            if self._depth == 0 and c != "{" and not (depth == 2 and c == "["):
                continue  # outside any object: tags and separators
            if c == '"':
                self._in_str = True
                if self._depth == depth and self._state == "key":
                    self._state, self._start = "key_str", i
                elif self._depth == depth and self._state == "value":
                    self._begin_value(i)
            elif c in "{[":
                if self._depth == depth and self._state == "value":
                    self._begin_value(i)
                self._depth += 1
                if c == "{" and self._depth == depth:
                    self.calls.append(ScannedCall())
                    self._state, self._key = "key", None
            elif c in "}]":
                self._depth = max(self._depth - 1, 0)
                if self._depth == depth and self._state == "in_value":
                    self._end_value(i + 1)
                elif self._depth == depth - 1 and self.calls and c == "}":
                    if self._state == "in_value":
                        self._end_value(i)
                    self.calls[-1].closed = True
                    self._state = "key"
            elif self._depth == depth:
                if c == ",":
                    if self._state == "in_value":
                        self._end_value(i)
                    self._state = "key"
                elif c == ":" and self._state == "colon":
                    self._state = "value"
                elif self._state == "value" and not c.isspace():
                    self._begin_value(i)  # a number, true, false or null
        self._pos = len(text)
        return self.calls

    def _begin_value(self, at: int) -> None:
        self._state, self._start = "in_value", at
        if self._key in self.args_keys and self.calls and self.calls[-1].args_start < 0:
            self.calls[-1].args_start = at

    def _end_value(self, end: int) -> None:
        call = self.calls[-1] if self.calls else None
        raw = self.text[self._start : end]
        if call is not None and self._key in NAME_KEYS and call.name is None:
            name = _loads(raw)
            call.name = name if isinstance(name, str) and name else None
        elif call is not None and self._key in self.args_keys and call.args_start == self._start:
            call.args_end = end
            if raw.startswith('"'):
                value = _loads(raw)
                call.args_str = value if isinstance(value, str) else None
        self._state = "after"

    def arguments(self, call: ScannedCall) -> str:
        """The call's arguments text so far (see the module docstring); "" before the value starts."""
        if call.args_start < 0:
            return ""
        if self.text[call.args_start] == '"':
            return call.args_str or "" if call.args_end >= 0 else ""
        end = call.args_end if call.args_end >= 0 else len(self.text)
        return self.text[call.args_start : end].rstrip()

    def final_arguments(self, call: ScannedCall) -> str:
        """The complete arguments of a closed call: "{}" when it had none."""
        return self.arguments(call) if call.args_start >= 0 else "{}"


def _loads(raw: str):
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


def call_from_json(raw: str, args_keys: tuple[str, ...] = ARGS_KEYS) -> tuple[str, str] | None:
    """(name, arguments) of one call written as a JSON object, or None when `raw` is not a JSON
    object with a non-empty string name and object (or JSON-text string) arguments. The arguments
    are the object's own source text, as the streaming scanner reports them."""
    if not isinstance(_loads(raw), dict):
        return None
    scanner = JsonCallScanner(1, args_keys)
    scanner.feed(raw)
    call = scanner.calls[0]
    if call.name is None:  # the first "name" key of the object, as the stream saw it
        return None
    if call.args_start >= 0 and raw[call.args_start] not in '{"':
        return None  # arguments must be an object (a number, list or null is no call)
    if (
        call.args_start >= 0
        and raw[call.args_start] == '"'
        and not isinstance(_loads(call.args_str or ""), dict)
    ):
        return None  # JSON text inside a string: it must hold an object too
    return call.name, scanner.final_arguments(call)


def calls_from_array(rest: str) -> list[tuple[str, str]] | None:
    """(name, arguments) of each call in `rest`, a JSON array of call objects and nothing else; None
    when it is not one (empty, an item without a name, arguments not an object or JSON-object text).
    The arguments are each object's own source text, as the streaming scanner reports them."""
    scanner = JsonCallScanner(2)
    scanner.feed(rest)
    try:
        items = json.loads(rest)
    except (ValueError, RecursionError):
        return None
    if not isinstance(items, list) or not items or len(items) != len(scanner.calls):
        return None
    found = []
    for item, call in zip(items, scanner.calls):
        if not isinstance(item, dict) or call.name is None or item.get("name") != call.name:
            return None
        args = item.get("arguments", item.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except (ValueError, RecursionError):
                return None
        if not isinstance(args, dict):
            return None
        found.append((call.name, scanner.final_arguments(call)))
    return found
