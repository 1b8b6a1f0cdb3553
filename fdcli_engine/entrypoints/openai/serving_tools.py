"""Tool calling in the chat serving layer: which `tool_choice` a request may use, and each choice's
output split into reasoning, content and tool calls, whole or streamed.

tool_choice (with `tools` given; absent means "auto", as in OpenAI's API):
- "auto": the output is parsed by the server's `--tool-call-parser`; without one, a 400.
- "none": tools still reach the chat template (vLLM's default) but the output is not parsed.
- "required" and a named function: a 400. Both need the output forced into a call (vLLM uses guided
  decoding for them); fd has no guided decoding, and parsing alone would not honour them.

Split rules (`OutputSplitter.split`), with R the reasoning parser and T the tool parser:
- reasoning, C = R.split(text), or (None, text) without R.
- calls parsed (T found well-formed blocks): content = C cut at T's start tag, trailing whitespace
  removed, None when empty. A call block is never content.
- no calls: content = C; if the text after the reasoning holds a (malformed) call block that neither
  field kept (ernie-x1's R drops call blocks from content), the raw text from that block on is
  appended: the model's words are never silently dropped.

Streaming re-splits the text received so far after every delta, less a tail that could still grow
into a tag or be trailing whitespace, and sends only the new part of each field; while a call block
is open, content is held at the cut. Every field sent before the end is a prefix of the whole-text
field whatever comes next, so the streamed deltas add up to exactly the non-streamed message. Tool
calls are sent whole, in one delta with `index` fields, when the output ends.
"""

from __future__ import annotations

from fdcli_engine.entrypoints.openai.errors import bad_request
from fdcli_engine.entrypoints.openai.parsed_output import ParsedOutput
from fdcli_engine.entrypoints.openai.reasoning_ernie import THINK_END

# Tags of the reasoning formats fd parses (<think>, ERNIE's <response>); the tool parser's own tags
# are added per splitter. A tail of the text that could grow into one of these is held back.
_REASONING_TAGS = ("<think>", "</think>", "<response>", "</response>")


def parses_tool_calls(req, tool_parser_cls) -> bool:
    """Whether this request's output is parsed for tool calls; a 400 for a choice fd cannot honour."""
    choice = req.tool_choice
    if not req.tools:
        if choice not in (None, "none"):
            raise bad_request("tool_choice needs tools: list the functions the model may call", "tool_choice")
        return False
    if isinstance(choice, dict):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        raise bad_request(
            f"a named tool_choice ({name or 'a function'}) is not supported: forcing a call needs guided "
            'decoding, which fd does not have; use "auto" or "none"',
            "tool_choice",
        )
    if choice == "required":
        raise bad_request(
            'tool_choice "required" is not supported: forcing a call needs guided decoding, which fd '
            'does not have; use "auto" or "none"',
            "tool_choice",
        )
    if choice not in (None, "auto", "none"):
        raise bad_request(f'tool_choice {choice!r} is not valid: use "auto" or "none"', "tool_choice")
    if choice == "none":
        return False
    if tool_parser_cls is None:
        raise bad_request(
            'tool calling (tool_choice "auto") needs fd serve (or fd run-batch) started with '
            '--tool-call-parser (e.g. ernie-x1); or send tool_choice "none"',
            "tools" if choice is None else "tool_choice",
        )
    return True


class OutputSplitter:
    """One choice's output -> reasoning, content and tool calls (see the module docstring)."""

    def __init__(self, reasoning_parser_cls=None, tool_parser_cls=None, parallel_tool_calls: bool = True):
        self.reasoning_parser_cls = reasoning_parser_cls
        self.tool_parser_cls = tool_parser_cls
        self.parallel_tool_calls = parallel_tool_calls
        self._tags = _REASONING_TAGS + (tool_parser_cls.tags if tool_parser_cls else ())
        self._text = ""
        self._sent_reasoning = 0
        self._sent_content = 0

    def _reason(self, text: str) -> tuple[str | None, str]:
        if self.reasoning_parser_cls is None:
            return None, text
        whole = self.reasoning_parser_cls().split(text)
        return whole.reasoning, whole.content

    def _tail_start(self, text: str) -> int:
        """Where the answer part of the raw text begins (after </think> when R splits reasoning)."""
        if self.reasoning_parser_cls is None or THINK_END not in text:
            return 0
        return text.index(THINK_END) + len(THINK_END)

    def split(self, text: str) -> ParsedOutput:
        reasoning, content = self._reason(text)
        if self.tool_parser_cls is None:
            return ParsedOutput(reasoning, content)
        tag = self.tool_parser_cls.start_tag
        extracted = self.tool_parser_cls().extract(text)
        if extracted.tools_called:
            calls = extracted.tool_calls
            if not self.parallel_tool_calls:
                calls = calls[:1]
            return ParsedOutput(reasoning, content.partition(tag)[0].rstrip() or None, calls)
        at = text.find(tag, self._tail_start(text))
        if at != -1 and tag not in content and tag not in (reasoning or ""):
            content = f"{content}\n\n{text[at:]}" if content else text[at:]
        return ParsedOutput(reasoning, content)

    def _held(self, text: str) -> str:
        """The text so far less a tail that could still change how it splits."""
        for n in range(min(len(text), max(map(len, self._tags)) - 1), 0, -1):
            if any(t.startswith(text[-n:]) for t in self._tags):
                text = text[:-n]
                break
        return text.rstrip()

    def feed(self, delta: str, final: bool = False) -> ParsedOutput:
        """One streamed delta -> the new reasoning and content text; tool calls only when `final`."""
        self._text += delta
        if final:
            whole = self.split(self._text)
            reasoning, content, calls = whole.reasoning or "", whole.content or "", whole.tool_calls
        else:
            held = self._held(self._text)
            reasoning, content = self._reason(held)
            reasoning, calls = reasoning or "", []
            tag = self.tool_parser_cls.start_tag if self.tool_parser_cls else None
            if tag and tag in content:
                content = content.partition(tag)[0].rstrip()  # a call block is open: hold at the cut
        out = ParsedOutput(reasoning[self._sent_reasoning :], content[self._sent_content :], calls)
        self._sent_reasoning = max(self._sent_reasoning, len(reasoning))
        self._sent_content = max(self._sent_content, len(content))
        return out
