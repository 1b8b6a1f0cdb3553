"""The Hermes / ChatML tool-call format (vLLM's "hermes" parser): Qwen2.5, Qwen3, SmolLM2 and other
ChatML models write each call as a JSON object between tags, possibly several in a row,

    <tool_call>
    {"name": "get_weather", "arguments": {"location": "Paris"}}
    </tool_call>

The last block may be left open when generation stopped at `</tool_call>` (a stop string). If any
block is not a call (see json_scan.call_from_json), the whole answer stays content: a half-parsed set
of calls would be worse than none. Content is the text before the first block; None when empty.
LongCat-Flash writes the same blocks between <longcat_tool_call> tags (vLLM's "longcat" parser).
"""

from __future__ import annotations

from fdcli_engine.entrypoints.openai.parsed_output import ParsedOutput, new_call_id, new_tool_call
from fdcli_engine.entrypoints.openai.tool_parsers.json_scan import JsonCallScanner, call_from_json

START, END = "<tool_call>", "</tool_call>"


class HermesToolParser:
    start_tag, end_tag = START, END
    tags = (START, END)
    reads_answer = True  # given the text after the reasoning block (serving_tools.OutputSplitter)

    def call_start(self, text: str) -> int:
        return text.find(self.start_tag)

    def calls_region(self, text: str) -> str | None:
        at = text.find(self.start_tag)
        return None if at == -1 else text[at:]

    def new_scanner(self) -> JsonCallScanner:
        return JsonCallScanner(1)

    new_id = staticmethod(new_call_id)

    def extract(self, text: str) -> ParsedOutput:
        at = text.find(self.start_tag)
        if at == -1:
            return ParsedOutput(None, text)
        calls = []
        for block in _blocks(text, at, self.start_tag, self.end_tag):
            call = call_from_json(block.strip())
            if call is None:
                return ParsedOutput(None, text)
            calls.append(new_tool_call(*call))
        return ParsedOutput(None, text[:at].rstrip() or None, calls)


def _blocks(text: str, at: int, start_tag: str, end_tag: str) -> list[str]:
    """The insides of the blocks from `at` on, the last one possibly unclosed. Text between or after
    blocks is not part of any call and is left out, as vLLM's hermes parser does. One pass: each
    search starts where the last one ended."""
    blocks = []
    while at != -1:
        start = at + len(start_tag)
        end = text.find(end_tag, start)
        if end == -1:
            blocks.append(text[start:])
            break
        blocks.append(text[start:end])
        at = text.find(start_tag, end + len(end_tag))
    return blocks


class LongcatToolParser(HermesToolParser):
    start_tag, end_tag = "<longcat_tool_call>", "</longcat_tool_call>"
    tags = (start_tag, end_tag)
