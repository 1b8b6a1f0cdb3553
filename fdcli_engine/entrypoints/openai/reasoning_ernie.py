"""FastDeploy's "ernie-x1" reasoning parser (ERNIE-4.5 thinking models, e.g. ERNIE-4.5-21B-A3B-Thinking).

The chat template opens the thinking block in the prompt, so the model's output is

    thinking text \n</think>\n\n<response>\nanswer\n</response>         (an answer), or
    thinking text \n</think>\n\n<tool_call>\n{...}\n</tool_call>        (a tool call)

and with `enable_thinking: false` (the template closes an empty block itself) it starts directly with
<response> or <tool_call>. Split:
- reasoning_content: the text before </think> (a leading <think> dropped), edge newlines stripped;
  None when the output starts with <response>/<tool_call> (no thinking); all of it when </think> never
  comes (the answer was cut off while thinking).
- content: the inside of <response>...</response> (edge newlines stripped); text after </response> is
  dropped. Tool-call blocks are not content: the tool-call parser (tool_parsers/ernie_x1.py) reads them
  from the raw text. With neither tag after </think>, the rest of the text (stripped) is the content.

Streaming is defined by the whole-text split: after each delta, the text so far (minus a tail that
could still grow into a tag) is split again and only the new part of each field is emitted. Each
field of a prefix's split is a prefix of the full text's split (the rules above only cut at tags and
strip newlines at edges), so the streamed deltas concatenate to exactly the whole-text answer.
"""

from __future__ import annotations

from fdcli_engine.entrypoints.openai.parsed_output import ParsedOutput, partial_tag_len

THINK_START, THINK_END = "<think>", "</think>"
RESPONSE_START, RESPONSE_END = "<response>", "</response>"
TOOL_CALL_START = "<tool_call>"
_TAGS = (THINK_START, THINK_END, RESPONSE_START, RESPONSE_END, TOOL_CALL_START, "</tool_call>")


def _response_of(rest: str) -> str:
    """Content from the text after </think> (or the whole output when thinking is off)."""
    response_at = rest.find(RESPONSE_START)
    tool_at = rest.find(TOOL_CALL_START)
    if response_at != -1 and (tool_at == -1 or response_at < tool_at):
        inside = rest[response_at + len(RESPONSE_START) :]
        inside = inside.partition(RESPONSE_END)[0]
        return inside.strip("\n")
    if tool_at != -1:
        return rest[:tool_at].strip()  # usually empty: a tool call is not content
    return rest.strip()


class ErnieX1ReasoningParser:
    # The attributes every reasoning parser class has (reasoning.ThinkParser's): its block is <think>'s,
    # and the prompt, not the parser, says whether the output starts inside it.
    starts_in_reasoning = False
    keeps_special_tokens = False

    @classmethod
    def tags(cls) -> tuple[str, str]:
        return THINK_START, THINK_END

    def __init__(self) -> None:
        self._text = ""
        self._sent_reasoning = 0
        self._sent_content = 0

    def split(self, text: str) -> ParsedOutput:
        """Whole text -> reasoning (None when thinking is off) and content."""
        body = text.lstrip()
        if body.startswith((RESPONSE_START, TOOL_CALL_START)):
            return ParsedOutput(None, _response_of(body))  # thinking disabled: no reasoning block at all
        if body.startswith(THINK_START):
            body = body[len(THINK_START) :]
        reasoning, found, rest = body.partition(THINK_END)
        reasoning = reasoning.strip("\n")
        if not found:
            return ParsedOutput(reasoning, "")
        return ParsedOutput(reasoning, _response_of(rest))

    def feed(self, delta: str, final: bool = False) -> ParsedOutput:
        """One streamed delta -> the reasoning and content deltas. `final` flushes the held-back tail."""
        self._text += delta
        text = self._text
        if not final:
            text = text[: len(text) - partial_tag_len(text, _TAGS)]
            # Trailing newlines may be stripped at a tag that is still to come: hold them back too.
            text = text.rstrip("\n")
        whole = self.split(text)
        reasoning, content = whole.reasoning or "", whole.content
        out_r = reasoning[self._sent_reasoning :]
        out_c = content[self._sent_content :]
        self._sent_reasoning = max(self._sent_reasoning, len(reasoning))
        self._sent_content = max(self._sent_content, len(content))
        return ParsedOutput(out_r, out_c)
