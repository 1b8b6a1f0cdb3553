"""What every output parser returns: reasoning parsers (`split`, `feed`), tool-call parsers
(`extract`) and the chat layer's OutputSplitter that combines them.

`reasoning` is None when the text has no reasoning block (a streamed delta uses ""); `content` is the
answer text, None when nothing is left around the tool calls; `tool_calls` are OpenAI wire tool calls.
"""

from __future__ import annotations

import secrets
import string
import uuid
from dataclasses import dataclass, field

from fdcli_engine.entrypoints.openai.protocol import FunctionCall, ToolCall


@dataclass
class ParsedOutput:
    reasoning: str | None
    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    # Streamed only (OutputSplitter.feed): the tool-call parts to send with this delta (DeltaToolCall).
    call_deltas: list = field(default_factory=list)

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


def new_call_id() -> str:
    """An OpenAI-style tool-call id: `call_` and 24 random hex digits."""
    return f"call_{uuid.uuid4().hex[:24]}"


_ALNUM = string.ascii_letters + string.digits


def mistral_call_id() -> str:
    """Mistral's tool-call id: 9 random letters and digits (its templates reject any other shape;
    vLLM generates the same)."""
    return "".join(secrets.choice(_ALNUM) for _ in range(9))


def new_tool_call(name: str, arguments: str, call_id: str | None = None) -> ToolCall:
    """A tool call with a fresh id; `arguments` is a JSON object as text (the OpenAI wire format)."""
    return ToolCall(id=call_id or new_call_id(), function=FunctionCall(name=name, arguments=arguments))
