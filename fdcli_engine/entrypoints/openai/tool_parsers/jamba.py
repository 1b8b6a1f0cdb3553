"""Jamba's tool-call format (vLLM's "jamba" parser; vLLM's "hunyuan_a13b" reads the same): one JSON
array of calls between tags, after any content,

    Sure!<tool_calls>[{"name": "get_weather", "arguments": {"city": "Dallas"}}]</tool_calls>

The closing tag may be missing when generation stopped at it. See tagged_array.py.
"""

from __future__ import annotations

from fdcli_engine.entrypoints.openai.tool_parsers.tagged_array import TaggedArrayToolParser


class JambaToolParser(TaggedArrayToolParser):
    starts = ("<tool_calls>",)
    end = "</tool_calls>"
