"""What every output parser returns: reasoning parsers (`split`, `feed`), tool-call parsers
(`extract`) and the chat layer's OutputSplitter that combines them.

`reasoning` is None when the text has no reasoning block (a streamed delta uses ""); `content` is the
answer text, None when nothing is left around the tool calls; `tool_calls` are OpenAI wire tool calls.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from fdcli_engine.entrypoints.openai.protocol import FunctionCall, ToolCall


@dataclass
class ParsedOutput:
    reasoning: str | None
    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)

    @property
    def tools_called(self) -> bool:
        return bool(self.tool_calls)


def partial_tag_len(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `tags`: a streamed
    tail that could still grow into a tag, held back from both fields until more text comes."""
    best = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(text)), best, -1):
            if text.endswith(tag[:n]):
                best = n
                break
    return best


def new_tool_call(name: str, arguments: str) -> ToolCall:
    """A tool call with a fresh id; `arguments` is a JSON object as text (the OpenAI wire format)."""
    return ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", function=FunctionCall(name=name, arguments=arguments))
