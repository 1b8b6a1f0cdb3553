"""Salesforce xLAM's tool-call format (vLLM's "xlam" parser): a JSON array of
`{"name", "arguments"}` objects, written bare as the answer (after any thinking block), or after
`[TOOL_CALLS]`, inside `<tool_call>…</tool_call>`, or in a ```json fence (or a bare fence holding an
array):

    [{"name": "get_weather", "arguments": {"city": "Paris"}}]

The first of these to appear is read (tagged_array.py's rules: text after the array is left out,
anything there that is not an array of calls leaves the whole answer as content). Content is the text
before it, None when empty. Arguments stream as they grow.
"""

from __future__ import annotations

import re

from fdcli_engine.entrypoints.openai.tool_parsers.tagged_array import TaggedArrayToolParser

TOOL_CALLS, TOOL_CALL, TOOL_CALL_END, JSON_FENCE = "[TOOL_CALLS]", "<tool_call>", "</tool_call>", "```json"
THINK_END = "</think>"
# A fence without a language holding an array, or one at the end of the text so far that may yet
# hold one (a stream holds its content back until it knows).
_ARRAY_FENCE = re.compile(r"```\s*(?:\[|$)")


class XLamToolParser(TaggedArrayToolParser):
    starts = (TOOL_CALLS, TOOL_CALL, JSON_FENCE)

    @property
    def tags(self) -> tuple[str, ...]:
        return (*self.starts, TOOL_CALL_END)

    def _tag_at(self, text: str) -> tuple[int, int]:
        found = [(at, at + len(tag)) for tag in self.starts if (at := text.find(tag)) != -1]
        if fence := _ARRAY_FENCE.search(text):
            found.append((fence.start(), fence.start() + 3))
        answer = text.rfind(THINK_END)
        answer = 0 if answer == -1 else answer + len(THINK_END)
        bare = len(text) - len(text[answer:].lstrip())
        if text.startswith("[", bare) and not text.startswith(TOOL_CALLS, bare):
            found.append((bare, bare))
        return min(found, default=(-1, -1))
