"""Granite 3.x's tool-call format (vLLM's "granite" parser): the whole answer is one JSON array of
calls, after `<|tool_call|>` (Granite 3.0) or `<tool_call>` (3.1), or bare,

    <|tool_call|> [{"name": "get_weather", "arguments": {"city": "Tokyo"}}]

so a call answer has no content, and an answer with text around the array is content. See
tagged_array.py. (Granite 4 writes hermes blocks: "granite4" is hermes.)
"""

from __future__ import annotations

from fdcli_engine.entrypoints.openai.tool_parsers.tagged_array import TaggedArrayToolParser


class GraniteToolParser(TaggedArrayToolParser):
    starts = ("<|tool_call|>", "<tool_call>")
    at_start = True
