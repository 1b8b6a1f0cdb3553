"""InternLM2 / InternLM2.5's tool-call format (vLLM's "internlm" parser): one call per answer, a
JSON object after the plugin action tokens,

    <|action_start|><|plugin|>
    {"name": "get_weather", "parameters": {"city": "Tokyo"}}<|action_end|>

(`arguments` is read as well as `parameters`). Content is the text before the call, None when
empty; text after it is left out. A call whose name is not among the request's tools is no call, as
in vLLM (without tools any name is read); so is anything there that is not a call object
(json_scan.call_from_json): the whole answer is then content. Arguments stream as they grow.
"""

from __future__ import annotations

from fdcli_engine.entrypoints.openai.parsed_output import ParsedOutput, new_call_id, new_tool_call
from fdcli_engine.entrypoints.openai.tool_parsers.json_scan import JsonCallScanner, call_from_json

ACTION_START, PLUGIN, ACTION_END = "<|action_start|>", "<|plugin|>", "<|action_end|>"
START = ACTION_START + PLUGIN


class InternLM2ToolParser:
    start_tag = START
    tags = (START, ACTION_START, ACTION_END)  # <|plugin|> only in START: held with what precedes it
    reads_answer = True
    reads_tools = True  # a name the request did not offer is no call
    new_id = staticmethod(new_call_id)

    def __init__(self, tools=None) -> None:
        self.tools = tools

    def call_start(self, text: str) -> int:
        return text.find(START)

    def calls_region(self, text: str) -> str | None:
        at = text.find(START)
        return None if at == -1 else text[at + len(START) :].partition(ACTION_END)[0]

    def new_scanner(self) -> JsonCallScanner:
        return JsonCallScanner(1)

    def extract(self, text: str) -> ParsedOutput:
        at = text.find(START)
        if at == -1:
            return ParsedOutput(None, text)
        block = text[at + len(START) :].partition(ACTION_END)[0]
        brace = block.find("{")
        call = call_from_json(block[brace:].strip()) if brace != -1 else None
        offered = {t.function.name for t in self.tools} if self.tools else None
        if call is None or (offered is not None and call[0] not in offered):
            return ParsedOutput(None, text)
        return ParsedOutput(None, text[:at].rstrip() or None, [new_tool_call(*call)])
