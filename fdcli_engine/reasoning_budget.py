"""Where a request's reasoning block and answer lie in its output, and the budgets on them. Leaf module.

FastDeploy's `reasoning_max_tokens` and vLLM's `thinking_token_budget` cap the reasoning: once that many
reasoning tokens are out and the block is still open, the end marker (`</think>`) is forced, one token
a step (the sampler), and the model goes on with its answer. FastDeploy's `response_max_tokens` caps
the answer: the request stops ("length") once that many answer tokens are out (the scheduler).

Every rule reads the request's output token ids alone, so preemption, n > 1 and draft rows need no
state of their own:
- The block opens after the first occurrence of `ReasoningMarkers.start` in the output, or at the
  output's first token when `start` is empty (the prompt opened it, or the parser's model starts
  inside it). It closes at the first occurrence of `end` after that.
- Reasoning tokens: those between the two, markers excluded (vLLM's count_reasoning_tokens; the
  `usage.completion_tokens_details.reasoning_tokens` the server reports). Under a budget of N the
  output holds exactly N of them, then the end marker.
- Answer tokens: those after the end marker; all of the output when no block is coming (no markers)
  or the output opened none (it holds no start marker and is not a prefix of one).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The reasoning block's tags: those of every reasoning parser fd has (entrypoints/openai/reasoning.py).
THINK_START, THINK_END = "<think>", "</think>"


@dataclass
class ReasoningMarkers:
    """The reasoning block's token ids, from the reasoning parser's tags and the tokenizer."""

    end: list[int]
    start: list[int] = field(default_factory=list)  # empty: the output starts inside the block


def markers_for_prompt(
    encode,
    prompt: str | None,
    template: str | None,
    starts_inside: bool = False,
    tags: tuple[str, str] = (THINK_START, THINK_END),
) -> ReasoningMarkers | None:
    """Where a request's reasoning block will lie in its output; None when no reasoning is coming:
    - the prompt already closes the block (enable_thinking: false in Qwen3's and ERNIE's templates
      writes an empty <think></think> into the generation prompt);
    - the prompt opens no block, the model would open it itself (Qwen3), and the chat template never
      mentions the end tag (a model without thinking).
    The output starts inside the block (no start marker) when the prompt opened it, as DeepSeek-R1's
    and ERNIE's templates do, or `starts_inside` (a parser whose model starts there); else it opens
    with <think> (Qwen3). `tags`: the block's start and end tags (the reasoning parser's: Mistral's
    [THINK] and [/THINK], Seed-OSS's <seed:think> and </seed:think>). `encode(text)` gives token ids
    without specials."""
    start, end = tags
    text = prompt or ""
    opened, closed = text.rfind(start), text.rfind(end)
    if closed > opened:
        return None
    inside = opened >= 0 or starts_inside
    if not inside and end not in (template or ""):
        return None
    return ReasoningMarkers(end=list(encode(end)), start=[] if inside else list(encode(start)))


def _find(seq: list[int], sub: list[int], begin: int = 0) -> int:
    """The first index >= begin where `sub` occurs in `seq`, else -1."""
    first, n = sub[0], len(sub)
    i = begin
    while True:
        try:
            i = seq.index(first, i)
        except ValueError:
            return -1
        if seq[i : i + n] == sub:
            return i
        i += 1


def reasoning_bounds(output: list[int], markers: ReasoningMarkers) -> tuple[int, int | None] | None:
    """(index of the first reasoning token, index of the end marker or None while the block is open);
    None when no block has opened."""
    begin = 0
    if markers.start:
        at = _find(output, markers.start)
        if at < 0:
            return None
        begin = at + len(markers.start)
    end = _find(output, markers.end, begin)
    return begin, (end if end >= 0 else None)


def reasoning_token_count(output: list[int], markers: ReasoningMarkers) -> int:
    bounds = reasoning_bounds(output, markers)
    if bounds is None:
        return 0
    begin, end = bounds
    return (len(output) if end is None else end) - begin


def answer_token_count(output: list[int], markers: ReasoningMarkers | None) -> int:
    if markers is None:
        return len(output)
    bounds = reasoning_bounds(output, markers)
    if bounds is None:
        start = markers.start
        undecided = len(output) < len(start) and start[: len(output)] == output
        return 0 if undecided else len(output)
    _, end = bounds
    return 0 if end is None else len(output) - end - len(markers.end)


def forced_token(output: list[int], markers: ReasoningMarkers, budget: int) -> int | None:
    """The token the next step must produce under a reasoning budget: the end marker's next token
    once `budget` reasoning tokens are out and the block is still open; else None."""
    bounds = reasoning_bounds(output, markers)
    if bounds is None or bounds[1] is not None:
        return None
    forced = len(output) - bounds[0] - budget  # end-marker tokens already forced
    return markers.end[forced] if 0 <= forced < len(markers.end) else None


def answer_limit_reached(output: list[int], params) -> bool:
    """Whether the request's response_max_tokens answer tokens are out (`params`: its SamplingParams)."""
    limit = params.response_max_tokens
    return limit is not None and answer_token_count(output, params.reasoning_markers) >= limit
