"""Kimi-K2's tool-call format (vLLM's "kimi_k2" parser): after the content, a section of calls, each
with the model's own call id (`functions.NAME:INDEX`, or `NAME:INDEX`) and JSON arguments,

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>
    {"city": "Beijing"}<|tool_call_end|><|tool_calls_section_end|>

(`<|tool_call_section_begin|>` too; the section's rules are delimited_calls.py's). The id is the
call's id, as vLLM returns it: Kimi's template writes it back into the next prompt. The name is the
id's part before ":" after its last "."; an id that is a bare counter ("0") names the request's only
tool, or the one tool whose parameters hold every key of the arguments (a call it cannot name so is
dropped, as vLLM does). An id without ":INDEX" is no call. Arguments are passed on as the model wrote
them (edge whitespace removed), as vLLM does.
"""

from __future__ import annotations

import json
import re

from fdcli_engine.entrypoints.openai.tool_parsers.delimited_calls import DelimitedCallsParser
from fdcli_engine.entrypoints.openai.tool_parsers.param_types import tool_properties
from fdcli_engine.entrypoints.openai.tool_parsers.reparse_scan import ReadCall

ARG_BEGIN = "<|tool_call_argument_begin|>"
_ID = re.compile(r"[^<]+:\d+|\d+")


class KimiK2ToolParser(DelimitedCallsParser):
    section_begins = ("<|tool_calls_section_begin|>", "<|tool_call_section_begin|>")
    section_ends = ("<|tool_calls_section_end|>", "<|tool_call_section_end|>")
    call_begin, call_end = "<|tool_call_begin|>", "<|tool_call_end|>"
    inner_tags = (ARG_BEGIN,)
    reads_tools = True  # a bare-counter id is named from the request's tools

    def _call(self, block: str, closed: bool) -> ReadCall | None:
        call_id, sep, args = block.partition(ARG_BEGIN)
        call_id, args = call_id.strip(), args.strip()
        if not sep or not _ID.fullmatch(call_id):
            return None
        name = self._name(call_id, args if closed else None)
        if name is None:
            return None if closed else ReadCall(None, "", call_id)
        return ReadCall(name, args, call_id)

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
