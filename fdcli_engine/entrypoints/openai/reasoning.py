"""Reasoning parsers: split `reasoning_content` out of generated text, whole or streamed.

`ThinkParser` handles `<think>…</think>` (Qwen3, DeepSeek-R1). Qwen3 opens the block itself, so text
with no `<think>` is plain content; DeepSeek-R1's template opens it in the prompt, so text before
`</think>` is reasoning even without an opening tag. Other models' tags (`start`, `end`) follow one of
the two rules: Mistral's `[THINK]…[/THINK]` Qwen3's, Seed-OSS's `<seed:think>…</seed:think>`
DeepSeek-R1's (vLLM's mistral and seed_oss parsers). The streaming parser keeps a tail that might be the
start of a tag, so a tag split across deltas is never leaked into either field.
"""

from __future__ import annotations

from fdcli_engine.entrypoints.openai.errors import bad_request
from fdcli_engine.entrypoints.openai.parsed_output import ParsedOutput, partial_tag_len
from fdcli_engine.reasoning_budget import THINK_END, THINK_START, ReasoningMarkers, markers_for_prompt

START, END = THINK_START, THINK_END


def reasoning_markers(
    parser_cls, encode, prompt: str | None, template: str | None
) -> ReasoningMarkers | None:
    """Where a chat request's reasoning block will lie in its output under a --reasoning-parser
    (reasoning_budget.markers_for_prompt); None without a parser or when no reasoning is coming."""
    if parser_cls is None:
        return None
    return markers_for_prompt(encode, prompt, template, parser_cls.starts_in_reasoning, parser_cls.tags())


def check_budget_has_parser(req, parser_cls) -> None:
    """A reasoning cap needs to know where the block lies: vLLM's 400 without a reasoning parser
    ("thinking_token_budget is set but reasoning_config is not configured")."""
    if parser_cls is not None:
        return
    for name in ("reasoning_max_tokens", "thinking_token_budget"):
        value = getattr(req, name, None)
        if value is not None and value != -1:
            raise bad_request(
                f"{name} needs a reasoning parser to find the reasoning block: start the server with "
                "--reasoning-parser (e.g. qwen3, deepseek_r1)",
                name,
            )


class ThinkParser:
    start, end = START, END
    starts_in_reasoning = False  # True: text before </think> is reasoning even without <think>
    keeps_special_tokens = False  # True: the tags are special tokens, which decoding must keep

    @classmethod
    def tags(cls) -> tuple[str, str]:
        return cls.start, cls.end

    def __init__(self) -> None:
        self._buf = ""
        self._state = "start"  # until we know whether the text opens with <think>

    def split(self, text: str) -> ParsedOutput:
        """Whole text → reasoning (None without a reasoning block) and content."""
        body = text
        stripped = body.lstrip()
        opened = stripped.startswith(self.start)
        if opened:
            body = stripped[len(self.start) :]
        elif not self.starts_in_reasoning:
            return ParsedOutput(None, text)
        if self.end in body:
            reasoning, _, content = body.partition(self.end)
            return ParsedOutput(reasoning, content.lstrip("\n"))
        return ParsedOutput(body, "")

    def feed(self, delta: str, final: bool = False) -> ParsedOutput:
        """One streamed delta → the reasoning and content deltas. `final` flushes the held-back tail."""
        self._buf += delta
        reasoning, content = "", ""
        while True:
            if self._state == "start":
                s = self._buf.lstrip()
                if s.startswith(self.start):
                    self._buf = s[len(self.start) :]
                    self._state = "reasoning"
                    continue
                if (self.start.startswith(s) or not s) and not final:
                    return ParsedOutput(reasoning, content)  # could still become <think>
                self._state = "reasoning" if self.starts_in_reasoning else "content"
                continue
            if self._state == "reasoning":
                if self.end in self._buf:
                    before, _, after = self._buf.partition(self.end)
                    reasoning += before
                    self._buf = after
                    self._state = "after_end"
                    continue
                keep = 0 if final else partial_tag_len(self._buf, (self.end,))
                reasoning += self._buf[: len(self._buf) - keep]
                self._buf = self._buf[len(self._buf) - keep :]
                return ParsedOutput(reasoning, content)
            if self._state == "after_end":
                s = self._buf.lstrip("\n")
                if not s and not final:
                    self._buf = ""
                    return ParsedOutput(reasoning, content)
                self._buf = s
                self._state = "content"
                continue
            content += self._buf
            self._buf = ""
            return ParsedOutput(reasoning, content)


class DeepSeekR1Parser(ThinkParser):
    starts_in_reasoning = True


class MistralReasoningParser(ThinkParser):
    """Magistral / Mistral's thinking models: `[THINK]…[/THINK]`, special tokens in their tokenizer."""

    start, end = "[THINK]", "[/THINK]"
    keeps_special_tokens = True


class SeedOssReasoningParser(DeepSeekR1Parser):
    start, end = "<seed:think>", "</seed:think>"


# FastDeploy's ernie-45-vl (ERNIE-4.5-VL): text before </think> is reasoning, as DeepSeek-R1's.
PARSERS = {
    "qwen3": ThinkParser,
    "think": ThinkParser,
    "deepseek_r1": DeepSeekR1Parser,
    "ernie_45_vl": DeepSeekR1Parser,
    # vLLM's names for the same rules: mimo is vLLM's qwen3 parser class itself; step3 and minimax_m2
    # take the text before </think> as reasoning without an opening tag, and all of it without one.
    "mimo": ThinkParser,
    "step3": DeepSeekR1Parser,
    "minimax_m2": DeepSeekR1Parser,
    "mistral": MistralReasoningParser,
    "seed_oss": SeedOssReasoningParser,
}
_SHOWN = [k.replace("_", "-") if k.startswith("ernie") else k for k in PARSERS]  # as FastDeploy spells it


def get_parser_cls(name: str | None):
    if not name:
        return None
    key = name.replace("-", "_").lower()
    if key == "ernie_x1":  # its own module (ERNIE-4.5 thinking models' <response> blocks)
        from fdcli_engine.entrypoints.openai.reasoning_ernie import ErnieX1ReasoningParser

        return ErnieX1ReasoningParser
    try:
        return PARSERS[key]
    except KeyError:
        from fdcli_engine.entrypoints.openai.vllm_parser_names import (
            REASONING_PARSERS_NOT_IN_FD,
            unknown_parser_message,
        )
        from fdcli_engine.errors import ConfigError

        choices = sorted([*_SHOWN, "ernie-x1"])
        message = unknown_parser_message("--reasoning-parser", name, REASONING_PARSERS_NOT_IN_FD, choices)
        raise ConfigError(message) from None
