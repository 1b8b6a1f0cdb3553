"""Conditional disaggregation: a prompt of at most `--max-local-prefill-length` tokens is prefilled by
the decode instance itself (NVIDIA Dynamo's `max_local_prefill_length`), skipping the prefill
instance and the KV transfer; a longer one goes through a prefill instance.

The count is the decode instance's own `/tokenize` of the prompt (of the messages and tools, rendered
with its chat template, for a chat request). A prompt the router does not count goes through a prefill
instance, the path without the threshold, so an estimate can only err towards disaggregating:
- a completion prompt of token ids is counted without asking; one of text is short without asking when
  its UTF-8 bytes plus `SPECIAL_TOKENS_BOUND` are within the threshold (a tokenizer's every piece covers
  at least one byte of the text, and it adds a few special tokens at most), long without asking when it
  has more than `CHARS_PER_TOKEN_BOUND` characters per allowed token, and asked otherwise;
- a batch of prompts, a chat message with non-text parts (images), or a failed `/tokenize` call is
  not counted.
"""

from __future__ import annotations

import httpx

# A text of more than this many characters per allowed token is taken as too long without asking the
# tokenizer; no tokenizer fd serves averages this many characters per token over a prompt.
CHARS_PER_TOKEN_BOUND = 32
# The most tokens a completion's tokenizer adds to a text beside its own pieces (BOS, EOS, ...).
SPECIAL_TOKENS_BOUND = 16
TOKENIZE_TIMEOUT_S = 10.0


def parse_max_local_prefill_length(value: str | int | None) -> int:
    """The flag's value as a token count >= 0 (0: every prompt is disaggregated); ValueError otherwise."""
    if value is None:
        return 0
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"--max-local-prefill-length must be a whole number of tokens, got {value!r}"
        ) from None
    if n < 0:
        raise ValueError(f"--max-local-prefill-length must be 0 (off) or a positive token count, got {n}")
    return n


def tokenize_body(path: str, body: dict, limit: int) -> dict | int | None:
    """What to ask `/tokenize` for the request's prompt, or its count when known without asking, or
    None when the router does not count it (the request goes through a prefill instance)."""
    if path.endswith("/chat/completions"):
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(_text_only(m) for m in messages):
            return None
        if sum(len(str(m.get("content") or "")) for m in messages) > CHARS_PER_TOKEN_BOUND * limit:
            return None
        req = {"messages": messages, "add_generation_prompt": body.get("add_generation_prompt", True)}
        if body.get("tools"):
            req["tools"] = body["tools"]
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return len(prompt)
        if not isinstance(prompt, str) or len(prompt) > CHARS_PER_TOKEN_BOUND * limit:
            return None
        if len(prompt) + SPECIAL_TOKENS_BOUND <= limit:  # characters first: no encoding of a long text
            most = len(prompt.encode()) + SPECIAL_TOKENS_BOUND
            if most <= limit:
                return most
        req = {"prompt": prompt}
    if body.get("model") is not None:
        req["model"] = body["model"]
    return req


async def prompt_tokens(client: httpx.AsyncClient, url: str, path: str, body: dict, headers, limit: int):
    """The prompt's token count by the instance at `url`, or None when not counted."""
    req = tokenize_body(path, body, limit)
    if req is None or isinstance(req, int):
        return req
    try:
        r = await client.post(url + "/tokenize", json=req, headers=headers, timeout=TOKENIZE_TIMEOUT_S)
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    count = r.json().get("count")
    return count if isinstance(count, int) else None


def _text_only(message) -> bool:
    if not isinstance(message, dict):
        return False
    content = message.get("content")
    if content is None or isinstance(content, str):
        return True
    return isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content)
