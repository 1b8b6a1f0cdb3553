"""Formats that write their calls as blocks between special tokens after a section token (kimi_k2.py,
deepseek_v3.py): content, then

    SECTION_BEGIN  CALL_BEGIN block CALL_END  CALL_BEGIN block CALL_END ...  SECTION_END

A subclass names its tokens and reads one block (`_call(block, closed)`: a ReadCall, or None when the
block is no call). Content is the text before the section, None when empty; text after the section
is left out, as are blocks that are no call; with no call read, the whole answer is content. A block
cut short by the next CALL_BEGIN is no call, nor is one CALL_END never closes (cut off by max_tokens):
vLLM reads calls with a regex that needs both tokens. Arguments stream as they grow (the open block
is read with a tail that could grow into a token held back).
"""

from __future__ import annotations

from fdcli_engine.entrypoints.openai.parsed_output import partial_tag_len
from fdcli_engine.entrypoints.openai.tool_parsers.reparse_scan import ReadCall, ReparseCallsParser


class DelimitedCallsParser(ReparseCallsParser):
    section_begins: tuple[str, ...] = ()
    section_ends: tuple[str, ...] = ()
    call_begin = call_end = ""
    inner_tags: tuple[str, ...] = ()  # the tokens inside a block

    @property
    def start_tag(self) -> str:
        return self.section_begins[0]

    @property
    def tags(self) -> tuple[str, ...]:
        return (*self.section_begins, *self.section_ends, self.call_begin, self.call_end, *self.inner_tags)

    def call_start(self, text: str) -> int:
        return min((i for i in map(text.find, self.section_begins) if i != -1), default=-1)

    def read_calls(self, region: str, final: bool = True) -> list[ReadCall]:
        """The calls in `region`; not `final`: the open block's call too, as far as it is known."""
        calls, pos = [], 0
        while (begin := region.find(self.call_begin, pos)) != -1:
            body_at = begin + len(self.call_begin)
            end = region.find(self.call_end, body_at)
            later = region.find(self.call_begin, body_at)
            if later != -1 and later < (end if end != -1 else len(region)):
                pos = later  # cut short by the next call
                continue
            if end == -1:
                if not final:
                    body = region[body_at:]
                    body = body[: len(body) - partial_tag_len(body, (self.call_begin, self.call_end))]
                    call = self._call(body, closed=False)
                    if call is not None:
                        calls.append(call)
                break
            call = self._call(region[body_at:end], closed=True)
            if call is not None:
                calls.append(call)
            pos = end + len(self.call_end)
        return calls

    def _call(self, block: str, closed: bool) -> ReadCall | None:
        """One block's call. Not `closed`: the block so far; its name None while not known yet, its
        arguments a prefix of the closed block's (None: nothing of it is known yet)."""
        raise NotImplementedError
