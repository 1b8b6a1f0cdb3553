"""The output of a forced tool choice, read directly (not through the model's own tool format, as
vLLM does): the grammar built by serving_tools.tool_choice_constraint makes the answer

- tool_choice "required": a JSON array of `{"name": <one tool's name>, "parameters": {...}}`;
- a named function: that function's arguments object itself.

Arguments are the source text of each parameters object (the stream sends it as it grows, so both
add up to the same text). An answer that is not of that shape (cut off by max_tokens) stays content.
The whole answer is the calls: no content is streamed before the end.
"""

from __future__ import annotations

import json

from fdcli_engine.entrypoints.openai.parsed_output import ParsedOutput, new_call_id, new_tool_call
from fdcli_engine.entrypoints.openai.tool_parsers.json_scan import JsonCallScanner, ScannedCall


class RequiredCallParser:
    start_tag = ""
    tags = ()
    reads_answer = True
    new_id = staticmethod(new_call_id)

    def call_start(self, text: str) -> int:
        return 0

    def calls_region(self, text: str) -> str | None:
        return text

    def new_scanner(self) -> JsonCallScanner:
        return JsonCallScanner(2, ("parameters",))

    def extract(self, text: str) -> ParsedOutput:
        try:
            items = json.loads(text)
        except (ValueError, RecursionError):
            return ParsedOutput(None, text)
        scanner = self.new_scanner()
        scanner.feed(text)
        if not isinstance(items, list) or not items or len(items) != len(scanner.calls):
            return ParsedOutput(None, text)
        calls = []
        for item, call in zip(items, scanner.calls):
            if (
                not isinstance(item, dict)
                or call.name is None
                or not isinstance(item.get("parameters"), dict)
            ):
                return ParsedOutput(None, text)
            calls.append(new_tool_call(call.name, scanner.final_arguments(call)))
        return ParsedOutput(None, None, calls)


class NamedCallParser:
    """The answer is `name`'s arguments object."""

    start_tag = ""
    tags = ()
    reads_answer = True
    new_id = staticmethod(new_call_id)

    def __init__(self, name: str):
        self.name = name

    def call_start(self, text: str) -> int:
        return 0

    def calls_region(self, text: str) -> str | None:
        return text

    def new_scanner(self) -> _ArgumentsScanner:
        return _ArgumentsScanner(self.name)

    def extract(self, text: str) -> ParsedOutput:
        try:
            args = json.loads(text)
        except (ValueError, RecursionError):
            return ParsedOutput(None, text)
        if not isinstance(args, dict):
            return ParsedOutput(None, text)
        return ParsedOutput(None, None, [new_tool_call(self.name, text.strip())])


class _ArgumentsScanner:
    """JsonCallScanner's interface for an answer that is one call's arguments."""

    def __init__(self, name: str):
        self.text = ""
        self.calls = [ScannedCall(name=name)]

    def feed(self, more: str) -> list[ScannedCall]:
        self.text += more
        return self.calls

    def arguments(self, call: ScannedCall) -> str:
        return self.text.strip()
