"""ERNIE-4.5's tool-call format (FastDeploy's "ernie-x1" tool parser): after the thinking block, each
call is one JSON object between tags,

    <tool_call>
    {"name": "get_weather", "arguments": {"location": "Beijing"}}
    </tool_call>

possibly several in a row. `arguments` may be an object (sent on as JSON text) or already a string.
If any block is not a JSON object with a non-empty string `name`, the output is treated as containing
no tool calls (the text stays content): a half-parsed set of calls would be worse than none. Content
is what the ernie-x1 reasoning parser would give (the <response> text) for output in ERNIE's thinking
format, else the text before the first call; None when only calls were made.
"""

from __future__ import annotations

import json

from fdcli_engine.entrypoints.openai.parsed_output import ParsedOutput, new_tool_call
from fdcli_engine.entrypoints.openai.protocol import ToolCall
from fdcli_engine.entrypoints.openai.reasoning_ernie import (
    RESPONSE_START,
    THINK_END,
    TOOL_CALL_START,
    ErnieX1ReasoningParser,
)

TOOL_CALL_END = "</tool_call>"


class ErnieX1ToolParser:
    start_tag = TOOL_CALL_START  # where a call begins: the serving layer cuts streamed content here
    tags = (TOOL_CALL_START, TOOL_CALL_END)

    def extract(self, text: str) -> ParsedOutput:
        after_think = text.partition(THINK_END)[2] if THINK_END in text else text
        blocks = _blocks(after_think)
        content = _content(text)
        if not blocks:
            return ParsedOutput(None, content)
        calls = []
        for block in blocks:
            call = _parse_block(block)
            if call is None:
                return ParsedOutput(None, text)
            calls.append(call)
        if not _thinking_format(text):
            content = text.partition(TOOL_CALL_START)[0].rstrip()  # a call block is never content
        return ParsedOutput(None, content or None, calls)


def _blocks(text: str) -> list[str]:
    """The insides of the closed <tool_call> blocks, in order. One pass: each search starts where
    the last one ended, so unclosed tags cost linear time (a lazy regex rescans the rest of the text
    from every opening tag)."""
    blocks, at = [], 0
    while (start := text.find(TOOL_CALL_START, at)) != -1:
        start += len(TOOL_CALL_START)
        end = text.find(TOOL_CALL_END, start)
        if end == -1:
            break
        blocks.append(text[start:end])
        at = end + len(TOOL_CALL_END)
    return blocks


def _thinking_format(text: str) -> bool:
    return THINK_END in text or text.lstrip().startswith((RESPONSE_START, TOOL_CALL_START))


def _content(text: str) -> str:
    """The answer text: as the ernie-x1 reasoning parser splits it when the output is in ERNIE's
    thinking format, else the text itself."""
    if _thinking_format(text):
        return ErnieX1ReasoningParser().split(text).content
    return text


def _parse_block(block: str) -> ToolCall | None:
    try:
        obj = json.loads(block.strip())
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the decoder allows
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if not isinstance(args, str):
        args = json.dumps(args, ensure_ascii=False)
    return new_tool_call(obj["name"], args)
