"""Llama 3.x's JSON tool-call format (vLLM's "llama3_json" parser): the answer is one or more JSON
objects `{"name": ..., "parameters": {...}}` separated by `;`, possibly after `<|python_tag|>`,

    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "now", "parameters": {}}

An answer that does not open with the tag or `{` is plain content; one that does but is not a list
of calls (see json_scan.call_from_json; `arguments` is read as well) stays content whole. A call
answer has no content.
"""

from __future__ import annotations

import json

from fdcli_engine.entrypoints.openai.parsed_output import ParsedOutput, new_call_id, new_tool_call
from fdcli_engine.entrypoints.openai.tool_parsers.json_scan import JsonCallScanner, call_from_json

PYTHON_TAG = "<|python_tag|>"
ARGS_KEYS = ("parameters", "arguments")
_decoder = json.JSONDecoder()


class Llama3JsonToolParser:
    start_tag = PYTHON_TAG
    tags = (PYTHON_TAG,)
    reads_answer = True
    new_id = staticmethod(new_call_id)

    def call_start(self, text: str) -> int:
        body = text.lstrip()
        return len(text) - len(body) if body.startswith((PYTHON_TAG, "{")) else -1

    def calls_region(self, text: str) -> str | None:
        at = self.call_start(text)
        return None if at == -1 else text[at:]

    def new_scanner(self) -> JsonCallScanner:
        return JsonCallScanner(1, ARGS_KEYS)

    def extract(self, text: str) -> ParsedOutput:
        at = self.call_start(text)
        if at == -1:
            return ParsedOutput(None, text)
        body = text[at:].removeprefix(PYTHON_TAG)
        calls, pos = [], 0
        while True:
            while pos < len(body) and body[pos].isspace():
                pos += 1
            if pos == len(body):
                break
            try:
                _, end = _decoder.raw_decode(body, pos)
            except (ValueError, RecursionError):
                return ParsedOutput(None, text)
            call = call_from_json(body[pos:end], ARGS_KEYS)
            if call is None:
                return ParsedOutput(None, text)
            calls.append(new_tool_call(*call))
            pos = end
            while pos < len(body) and body[pos].isspace():
                pos += 1
            if pos < len(body):
                if body[pos] != ";":
                    return ParsedOutput(None, text)
                pos += 1
        if not calls:
            return ParsedOutput(None, text)
        return ParsedOutput(None, None, calls)
