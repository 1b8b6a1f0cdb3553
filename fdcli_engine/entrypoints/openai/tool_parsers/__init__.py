"""Tool-call parsers, selected by `--tool-call-parser`: turn a model's raw output into OpenAI
`tool_calls` plus the remaining content.

A parser class has `extract(text) -> ExtractedToolCalls`. Only whole outputs are parsed (a streamed
response can send its tool calls with the final chunk).
"""

from __future__ import annotations

from fdcli_engine.entrypoints.openai.tool_parsers.base import ExtractedToolCalls, ToolCall
from fdcli_engine.entrypoints.openai.tool_parsers.ernie_x1 import ErnieX1ToolParser

TOOL_PARSERS = {"ernie_x1": ErnieX1ToolParser}

__all__ = ["TOOL_PARSERS", "ExtractedToolCalls", "ToolCall", "get_tool_parser_cls"]


def get_tool_parser_cls(name: str | None):
    if not name:
        return None
    try:
        return TOOL_PARSERS[name.replace("-", "_").lower()]
    except KeyError:
        from fdcli_engine.errors import ConfigError  # noqa: PLC0415

        choices = ", ".join(n.replace("_", "-") for n in sorted(TOOL_PARSERS))
        raise ConfigError(f"--tool-call-parser {name!r}: choose one of {choices}") from None
