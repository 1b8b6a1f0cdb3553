"""Qwen3-Coder's XML tool-call format (vLLM's "qwen3_coder" and "qwen3_xml" parsers; "seed_oss" wraps
the same calls in <seed:tool_call>…</seed:tool_call>):

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

possibly several calls in a row; a call without the <tool_call> wrapper is read too (vLLM's fallback).
Each value is the text between the tags less one leading and one trailing newline, converted to the
type the request's tool schema declares (param_types.py). A value may contain literal XML: it ends at
the first </parameter> (not paired with a `\n<parameter=` inside the value) that is followed by
another <parameter=, </function> or </tool_call>, or ends the output; a value whose closing tag is
missing ends at the next `\n<parameter=`, else at </function>. A function body ends at </function>
or at the first text that is neither a parameter nor </function>.

Content is the text before the first <tool_call> (or <function=), None when empty; text between and
after calls is left out. A call whose name is empty or holds whitespace, quotes, braces or angle
brackets (an unrendered template, not a call) is dropped, as vLLM does; with no call left the whole
answer is content. Arguments stream as each parameter is complete: `{`, then `"name": value` pairs,
then `}` at </function>, as vLLM streams them.
"""

from __future__ import annotations

from fdcli_engine.entrypoints.openai.tool_parsers.param_types import (
    convert_param,
    json_pair,
    tool_properties,
)
from fdcli_engine.entrypoints.openai.tool_parsers.reparse_scan import ReadCall, ReparseCallsParser

TOOL_CALL, TOOL_CALL_END = "<tool_call>", "</tool_call>"
FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAM, PARAM_END = "<parameter=", "</parameter>"
NESTED_PARAM = "\n" + PARAM  # a parameter tag at a line start: structural, or literal XML in a value
_NOT_IN_NAME = frozenset("{}<>\"' \t\n\r")


class Qwen3CoderToolParser(ReparseCallsParser):
    start_tag, end_tag = TOOL_CALL, TOOL_CALL_END  # the wrapper of each call
    reads_tools = True  # built with the request's tools: values take their schemas' types

    def __init__(self, tools=None) -> None:
        super().__init__(tools)
        self.tags = (self.start_tag, self.end_tag, FUNCTION, FUNCTION_END, PARAM, PARAM_END)
        self._after_value = (PARAM, FUNCTION_END, self.end_tag)  # what may follow a value's end tag

    def call_start(self, text: str) -> int:
        return min((i for i in (text.find(self.start_tag), text.find(FUNCTION)) if i != -1), default=-1)

    def read_calls(self, region: str, final: bool = True) -> list[ReadCall]:
        """The calls in `region`; not `final`: only what more text cannot change (a call once its
        name is complete, its arguments up to the last complete parameter, `}` once it closed)."""
        calls, pos = [], 0
        while (at := region.find(FUNCTION, pos)) != -1:
            name_at = at + len(FUNCTION)
            name_end = region.find(">", name_at)
            if name_end == -1:
                break
            name = region[name_at:name_end]
            props = tool_properties(self.tools, name)
            pairs, pos, closed = _body(region, name_end + 1, props, self._after_value, final)
            if name and not _NOT_IN_NAME.intersection(name):
                calls.append(ReadCall(name, "{" + ", ".join(pairs) + ("}" if closed or final else "")))
            if not closed:
                break
        return calls


def _body(region: str, i: int, props: dict, after_value, final: bool) -> tuple[list[str], int, bool]:
    """A function body's `"name": value` pairs from `i`, where it ends, and whether it is closed
    (not final: False while more text could still add to it)."""
    pairs: list[str] = []
    while True:
        i = _skip_space(region, i)
        if region.startswith(FUNCTION_END, i):
            return pairs, i + len(FUNCTION_END), True
        if not region.startswith(PARAM, i):
            return pairs, i, final or not _may_become(region, i, (PARAM, FUNCTION_END))
        name_end = region.find(">", i + len(PARAM))
        found = _value_end(region, name_end + 1, after_value, final) if name_end != -1 else None
        if found is None:
            return pairs, i, final
        name = region[i + len(PARAM) : name_end]
        value_end, i = found
        value = region[name_end + 1 : value_end].removeprefix("\n").removesuffix("\n")
        pairs.append(json_pair(name, convert_param(value, name, props)))


def _value_end(region: str, start: int, after_value, final: bool) -> tuple[int, int] | None:
    """(where the value from `start` ends, where the body goes on) or None (not final: not known yet)."""
    depth, j = 0, start
    while (close := region.find(PARAM_END, j)) != -1:
        nested = region.find(NESTED_PARAM, j, close)
        if nested != -1:
            depth, j = depth + 1, nested + len(NESTED_PARAM)
            continue
        after = close + len(PARAM_END)
        j = after
        if depth:
            depth -= 1
            continue
        next_at = _skip_space(region, after)
        if region.startswith(after_value, next_at) or (final and next_at == len(region)):
            return close, after
        if not final and _may_become(region, next_at, after_value):
            return None  # what follows is not known yet
    if not final:
        return None
    nested = region.find(NESTED_PARAM, start)
    if nested != -1:  # the closing tag is missing: the next parameter ends the value
        return nested + 1, nested + 1
    end = region.find(FUNCTION_END, start)
    return (end, end) if end != -1 else (len(region), len(region))


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def _may_become(text: str, i: int, tags: tuple[str, ...]) -> bool:
    """Whether the text from `i` (all of it: the end of the text so far) could still grow into one
    of `tags`."""
    rest = text[i : i + max(map(len, tags))]
    return len(rest) < max(map(len, tags)) and any(tag.startswith(rest) for tag in tags)


class SeedOssToolParser(Qwen3CoderToolParser):
    start_tag, end_tag = "<seed:tool_call>", "</seed:tool_call>"
