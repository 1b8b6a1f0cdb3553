"""Kimi-K2's tool-call format (vLLM's "kimi_k2" parser): after the content, a section of calls, each
with the model's own call id (`functions.NAME:INDEX`, or `NAME:INDEX`) and JSON arguments,

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>
    {"city": "Beijing"}<|tool_call_end|><|tool_calls_section_end|>

(`<|tool_call_section_begin|>` too). The id is the call's id, as vLLM returns it: Kimi's template
writes it back into the next prompt. The name is the id's part before ":" after its last "."; an id
that is a bare counter ("0") names the request's only tool, or the one tool whose parameters hold
every key of the arguments (a call it cannot name so is dropped, as vLLM does). An id without
":INDEX", and a call not closed by <|tool_call_end|>, is no call. Arguments are passed on as the
model wrote them (edge whitespace removed), and stream as they grow.

Content is the text before the section, None when empty; text after it is left out. With no call
read, the whole answer is content.
"""

from __future__ import annotations

import json
import re

from fdcli_engine.entrypoints.openai.parsed_output import (
    ParsedOutput,
    new_call_id,
    new_tool_call,
    partial_tag_len,
)
from fdcli_engine.entrypoints.openai.tool_parsers.param_types import tool_properties
from fdcli_engine.entrypoints.openai.tool_parsers.reparse_scan import ReadCall, ReparseScanner

SECTION_BEGINS = ("<|tool_calls_section_begin|>", "<|tool_call_section_begin|>")
SECTION_ENDS = ("<|tool_calls_section_end|>", "<|tool_call_section_end|>")
CALL_BEGIN, ARG_BEGIN, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
_ID = re.compile(r"[^<]+:\d+|\d+")


class KimiK2ToolParser:
    start_tag = SECTION_BEGINS[0]
    tags = (*SECTION_BEGINS, *SECTION_ENDS, CALL_BEGIN, ARG_BEGIN, CALL_END)
    reads_answer = True
    reads_tools = True  # a bare-counter id is named from the request's tools
    new_id = staticmethod(new_call_id)

    def __init__(self, tools=None) -> None:
        self.tools = tools

    def call_start(self, text: str) -> int:
        return min((i for i in map(text.find, SECTION_BEGINS) if i != -1), default=-1)

    def calls_region(self, text: str) -> str | None:
        at = self.call_start(text)
        return None if at == -1 else text[at:]

    def new_scanner(self) -> ReparseScanner:
        return ReparseScanner(self.read_calls)

    def extract(self, text: str) -> ParsedOutput:
        at = self.call_start(text)
        calls = self.read_calls(text[at:], final=True) if at != -1 else []
        if not calls:
            return ParsedOutput(None, text)
        tool_calls = [new_tool_call(c.name, c.arguments, c.id) for c in calls]
        return ParsedOutput(None, text[:at].rstrip() or None, tool_calls)

    def read_calls(self, region: str, final: bool = True) -> list[ReadCall]:
        calls, pos = [], 0
        while (begin := region.find(CALL_BEGIN, pos)) != -1:
            id_at = begin + len(CALL_BEGIN)
            args_tag = region.find(ARG_BEGIN, id_at)
            if args_tag == -1:
                break  # the id is not complete
            args_at = args_tag + len(ARG_BEGIN)
            end = region.find(CALL_END, args_at)
            later = region.find(CALL_BEGIN, id_at)
            if later != -1 and later < (end if end != -1 else len(region)):
                pos = later  # a call cut short by the next one: not a call
                continue
            call_id = region[id_at:args_tag].strip()
            if not _ID.fullmatch(call_id):
                if end == -1:
                    break
                pos = end + len(CALL_END)
                continue
            if end == -1:  # still open: only a stream reads it
                if not final:
                    args = region[args_at:]
                    args = args[: len(args) - partial_tag_len(args, (CALL_BEGIN, CALL_END))].strip()
                    name = self._name(call_id, None)
                    calls.append(ReadCall(name, args if name else "", call_id))
                break
            args = region[args_at:end].strip()
            name = self._name(call_id, args)
            if name:  # else a bare counter no tool fits: dropped
                calls.append(ReadCall(name, args, call_id))
            pos = end + len(CALL_END)
        return calls

    def _name(self, call_id: str, args: str | None) -> str | None:
        """The function a call id names; a bare counter's from the tools (None: not known yet)."""
        if not call_id.isdigit():
            return call_id.split(":")[0].split(".")[-1]
        names = [t.function.name for t in self.tools or ()]
        if len(names) == 1:
            return names[0]
        if args is None:
            return None
        try:
            keys = json.loads(args)
        except (ValueError, RecursionError):
            return None
        if not isinstance(keys, dict):
            return None
        fits = [n for n in names if set(keys) <= set(tool_properties(self.tools, n))]
        return fits[0] if len(fits) == 1 else None
