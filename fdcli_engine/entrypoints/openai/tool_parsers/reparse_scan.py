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
