"""DeepSeek's tool-call formats (vLLM's "deepseek_v3" and "deepseek_v31" parsers), blocks between
DeepSeek's special tokens (the section's rules are delimited_calls.py's):

- V3 / R1-0528: `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME` newline, then the arguments in a
  ```json fence, then `<｜tool▁call▁end｜>`;
- V3.1: `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{…}<｜tool▁call▁end｜>`,

all after `<｜tool▁calls▁begin｜>` and before `<｜tool▁calls▁end｜>`. Arguments are passed on as the
model wrote them (edge whitespace removed), as vLLM does, and stream as they grow; arguments on
several lines are read too (vLLM's regex reads one line). Ids are fd's own (`call_…`), as vLLM's.
"""

from __future__ import annotations

from fdcli_engine.entrypoints.openai.tool_parsers.delimited_calls import DelimitedCallsParser
from fdcli_engine.entrypoints.openai.tool_parsers.reparse_scan import ReadCall

SEP = "<｜tool▁sep｜>"
FENCE_OPEN, FENCE_CLOSE = "```json\n", "```"


class DeepSeekV31ToolParser(DelimitedCallsParser):
    section_begins = ("<｜tool▁calls▁begin｜>",)
    section_ends = ("<｜tool▁calls▁end｜>",)
    call_begin, call_end = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"
    inner_tags = (SEP,)

    def _call(self, block: str, closed: bool) -> ReadCall | None:
        name, sep, args = block.partition(SEP)
        name = name.strip()
        return ReadCall(name, args.strip()) if sep and name else None


class DeepSeekV3ToolParser(DeepSeekV31ToolParser):
    def _call(self, block: str, closed: bool) -> ReadCall | None:
        kind, sep, rest = block.partition(SEP)
        name, newline, body = rest.partition("\n")
        name = name.strip()
        if not sep or not newline or not name or not kind.strip():
            return None
        if not body.startswith(FENCE_OPEN):
            return None  # not yet known, or no fence: no call
        args = body[len(FENCE_OPEN) :].rstrip()
        if closed:
            return ReadCall(name, args[: -len(FENCE_CLOSE)].strip()) if args.endswith(FENCE_CLOSE) else None
        return ReadCall(name, args.rstrip("`").rstrip())  # a fence may be closing: held back
