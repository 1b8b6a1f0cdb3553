"""The streaming scanner of formats whose calls are not JSON objects (qwen3_coder's XML, kimi_k2's and
deepseek's token-delimited calls): the parser's `read_calls(region, final=False)` re-reads the calls
region as it grows, and this adapts the result to the interface of json_scan.JsonCallScanner that the
chat layer streams from (serving_tools.OutputSplitter._scan).

Invariant (each parser's, checked by its tests): for a region that grows by appending, every call
`read_calls` reports keeps its name and its arguments text only grows; the arguments it reports are
a prefix of what `read_calls(whole, final=True)` gives at the end, so streamed fragments add up to
the non-streamed arguments exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

from fdcli_engine.entrypoints.openai.parsed_output import ParsedOutput, new_call_id, new_tool_call


@dataclass
class ReadCall:
    name: str | None  # None: not known yet (the calls after it wait too)
    arguments: str  # JSON object text so far; whole once the call is closed
    id: str | None = None  # the model's own call id, where its format writes one


class ReparseScanner:
    def __init__(self, read_calls):
        self._read = read_calls
        self.text = ""
        self._calls: list[ReadCall] = []

    def feed(self, more: str) -> list[ReadCall]:
        self.text += more
        self._calls = self._read(self.text, final=False)
        return self._calls

    @staticmethod
    def arguments(call: ReadCall) -> str:
        return call.arguments


class ReparseCallsParser:
    """A tool parser whose calls region begins where `call_start(text)` finds it (-1: no call) and is
    read by `read_calls(region, final)` (the subclass's; the module docstring's invariant): content is
    the text before the region, right-trimmed, None when empty; with no call read, the whole answer is
    content. A call keeps the model's own id where its format writes one."""

    reads_answer = True
    new_id = staticmethod(new_call_id)

    def __init__(self, tools=None) -> None:
        self.tools = tools

    def call_start(self, text: str) -> int:
        raise NotImplementedError

    def read_calls(self, region: str, final: bool = True) -> list[ReadCall]:
        raise NotImplementedError

    def calls_region(self, text: str) -> str | None:
        at = self.call_start(text)
        return None if at == -1 else text[at:]

    def new_scanner(self) -> ReparseScanner:
        return ReparseScanner(self.read_calls)

    def extract(self, text: str) -> ParsedOutput:
        at = self.call_start(text)
        calls = self.read_calls(text[at:], final=True) if at != -1 else []
        if not calls:
            return ParsedOutput(None, text)
        tool_calls = [new_tool_call(c.name, c.arguments, c.id) for c in calls]
        return ParsedOutput(None, text[:at].rstrip() or None, tool_calls)
