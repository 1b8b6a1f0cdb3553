"""A warning when most replies stop after at most one token although more were asked for.

The usual cause: chat-style data (ShareGPT's first human turn, a chat dataset's question) sent to
/v1/completions as raw text. An instruct model then sees a finished user turn and ends its own at
once (SmolLM2-Instruct: `<|im_end|>` is the likeliest next token), so every reply is empty and the
run measures nothing. That is the model's real behaviour, not a server fault: the fix is to let the
server apply the chat template (--backend openai-chat) or to ask for fixed lengths (--ignore-eos).
"""

from __future__ import annotations

from fdcli.bench.datasets import SampleRequest
from fdcli.bench.metrics import RequestRecord

MIN_SHARE = 0.5  # of the successful requests that asked for more than one token


def early_stop_warning(
    records: list[RequestRecord], requests: list[SampleRequest], backend: str, ignore_eos: bool
) -> str | None:
    if ignore_eos or backend == "embeddings":  # embeddings have no output tokens to stop early
        return None
    asked = [r for r in records if r.ok and 0 <= r.index < len(requests) and requests[r.index].output_len > 1]
    short = [r for r in asked if r.output_tokens <= 1]
    if not asked or len(short) < MIN_SHARE * len(asked):
        return None
    head = (
        f"warning: {len(short)} of {len(asked)} replies ended after at most 1 token although more were "
        "asked for (the model stopped at once), so the latency and throughput numbers mean little."
    )
    if backend == "openai":
        return (
            f"{head} Chat-style prompts (sharegpt, chat datasets) sent to /v1/completions as raw text make an "
            "instruct model end its turn at once: use --backend openai-chat so the server applies the chat "
            "template, or --ignore-eos for fixed output lengths."
        )
    return f"{head} Use --ignore-eos for fixed output lengths."
