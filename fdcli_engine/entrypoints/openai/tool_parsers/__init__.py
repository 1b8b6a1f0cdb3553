"""Tool-call parsers, selected by `--tool-call-parser`: turn a model's raw output into OpenAI
`tool_calls` plus the remaining content.

A parser class has `extract(text) -> ParsedOutput` (parsed_output.py), `start_tag` (the text that opens a call:
streamed content is held back from there) and `tags` (every tag of its format: a streamed tail that
could grow into one is held back). Only whole outputs are parsed: a streamed response sends its tool
calls when the output ends (serving_tools.py).
"""

from __future__ import annotations

from fdcli_engine.entrypoints.openai.tool_parsers.ernie_x1 import ErnieX1ToolParser

TOOL_PARSERS = {"ernie_x1": ErnieX1ToolParser}

__all__ = ["TOOL_PARSERS", "ErnieX1ToolParser", "get_tool_parser_cls"]


def get_tool_parser_cls(name: str | None):
    if not name:
        return None
    try:
        return TOOL_PARSERS[name.replace("-", "_").lower()]
    except KeyError:
        from fdcli_engine.errors import ConfigError  # noqa: PLC0415

        choices = ", ".join(n.replace("_", "-") for n in sorted(TOOL_PARSERS))
        raise ConfigError(f"--tool-call-parser {name!r}: choose one of {choices}") from None
