"""Phi-4-mini's tool-call format (vLLM's "phi4_mini_json" parser): a JSON array of calls right after
the word `functools`, after any content,

    functools[{"name": "get_weather", "arguments": {"city": "Tokyo"}}]

Text before it is content (vLLM drops it); text after the array is left out. See tagged_array.py.
"""

from __future__ import annotations

from fdcli_engine.entrypoints.openai.tool_parsers.tagged_array import TaggedArrayToolParser


class Phi4MiniJsonToolParser(TaggedArrayToolParser):
    starts = ("functools[",)

    def _tag_at(self, text: str) -> tuple[int, int]:
        at, _ = super()._tag_at(text)
        return (at, at + len("functools")) if at != -1 else (-1, -1)
