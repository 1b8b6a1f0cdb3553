"""vLLM's truncate_prompt_tokens on a pooled prompt: keep its first tokens (vLLM's truncation_side
"right", the default) or its last ("left"), and the special tokens the tokenizer framed it with (as
sentence-transformers and a tokenizer truncating on either side do: [CLS] a b c … [SEP]). Shared by the
server's pooling routes and the offline LLM's pooling calls; the limit itself is
request_limits.truncate_limit."""

from __future__ import annotations

from collections.abc import Callable


def truncate_ids(
    ids: list[int], limit: int, prefix: int = 0, suffix: int = 0, side: str | None = None
) -> list[int]:
    """The first (`side` "left": the last) tokens of `ids` within `limit`, keeping `prefix`/`suffix`
    special tokens at the ends."""
    if len(ids) <= limit:
        return ids
    if limit <= prefix + suffix:
        return ids[len(ids) - limit :] if side == "left" else ids[:limit]
    body = ids[prefix : len(ids) - suffix]
    keep = limit - prefix - suffix
    kept = body[len(body) - keep :] if side == "left" else body[:keep]
    return ids[:prefix] + kept + ids[len(ids) - suffix :]


def special_token_frame(full: list[int], plain: list[int]) -> tuple[int, int]:
    """(prefix, suffix) counts of the special tokens the tokenizer put around `plain` to make `full`."""
    extra = len(full) - len(plain)
    for p in range(max(extra, 0) + 1):
        if full[p : p + len(plain)] == plain:
            return p, extra - p
    return 0, 0


def truncate_text_ids(
    ids: list[int], limit: int | None, plain: Callable[[], list[int]] | None, side: str | None = None
) -> list[int]:
    """A text's ids cut to `limit` (None: kept whole) on `side`, the special tokens the tokenizer framed
    it with kept; `plain()` encodes the text without them (asked only when a cut is due; None: ids hold
    none)."""
    if not limit or len(ids) <= limit:
        return ids
    return truncate_ids(ids, limit, *(special_token_frame(ids, plain()) if plain else (0, 0)), side=side)
