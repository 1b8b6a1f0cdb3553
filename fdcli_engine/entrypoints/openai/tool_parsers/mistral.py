"""Mistral's tool-call formats (vLLM's "mistral" parser), after the `[TOOL_CALLS]` token:

- before tokenizer v11 (Mistral-7B-Instruct-v0.3): one JSON array of calls,
  `[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, ...]`;
- v11 and later (Mistral-Small-3.x, Ministral, Devstral): each call as `[TOOL_CALLS]name{...}`, or
  `[TOOL_CALLS]name[ARGS]{...}`, with an optional `[CALL_ID]id` after the name.

Content is the text before the first `[TOOL_CALLS]`; None when empty. Anything after the tag that is
not a list of calls in one of these forms leaves the whole answer as content. Ids are Mistral's 9
letters and digits. The array form's arguments are streamed as they grow; the v11 form's calls are
sent whole when the output ends.
"""

from __future__ import annotations

import json

from fdcli_engine.entrypoints.openai.parsed_output import ParsedOutput, mistral_call_id, new_tool_call
from fdcli_engine.entrypoints.openai.tool_parsers.json_scan import JsonCallScanner, calls_from_array

TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
_decoder = json.JSONDecoder()


class MistralToolParser:
    start_tag = TOOL_CALLS
    tags = (TOOL_CALLS, ARGS, CALL_ID)
    reads_answer = True
    new_id = staticmethod(mistral_call_id)

    def call_start(self, text: str) -> int:
        return text.find(TOOL_CALLS)

    def calls_region(self, text: str) -> str | None:
        """The JSON array after the tag (streamed); None until it is known to be the array form."""
        at = text.find(TOOL_CALLS)
        rest = text[at + len(TOOL_CALLS) :].lstrip() if at != -1 else ""
        return rest if rest.startswith("[") else None

    def new_scanner(self) -> JsonCallScanner:
        return JsonCallScanner(2)

    def extract(self, text: str) -> ParsedOutput:
        at = text.find(TOOL_CALLS)
        if at == -1:
            return ParsedOutput(None, text)
        rest = text[at + len(TOOL_CALLS) :].strip()
        found = calls_from_array(rest) if rest.startswith("[") else _v11_calls(text[at:])
        if not found:
            return ParsedOutput(None, text)
        calls = [new_tool_call(name, args, mistral_call_id()) for name, args in found]
        return ParsedOutput(None, text[:at].rstrip() or None, calls)


def _v11_calls(text: str) -> list[tuple[str, str]] | None:
    """`[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}` repeated (CALL_ID and ARGS optional)."""
    found = []
    for part in text.split(TOOL_CALLS)[1:]:
        name, sep, body = _name_and_body(part)
        if not name or not sep:
            return None
        try:
            obj, end = _decoder.raw_decode(body)
        except (ValueError, RecursionError):
            return None
        if not isinstance(obj, dict) or body[end:].strip():
            return None
        found.append((name, body[:end]))
    return found


def _name_and_body(part: str) -> tuple[str, bool, str]:
    """(name, whether arguments follow, the arguments text) of one v11 call."""
    cut = min((i for i in (part.find(ARGS), part.find(CALL_ID), part.find("{")) if i != -1), default=-1)
    if cut == -1:
        return "", False, ""
    name, rest = part[:cut].strip(), part[cut:]
    if rest.startswith(CALL_ID):
        rest = rest[len(CALL_ID) :]
        rest = rest[rest.find(ARGS) :] if ARGS in rest else rest[rest.find("{") :] if "{" in rest else ""
    rest = rest.removeprefix(ARGS)
    ok = bool(name) and name.replace("_", "").replace("-", "").replace(".", "").isalnum()
    return name, ok and rest.lstrip().startswith("{"), rest.lstrip()
