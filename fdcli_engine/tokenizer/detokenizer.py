"""Incremental detokenization for streaming.

Invariant: the concatenation of every `add_tokens` delta followed by `flush()` equals
`tokenizer.decode(output_ids, skip_special_tokens)` (byte-level BPE and SentencePiece byte fallback) — a
delta never contains a partial UTF-8 character (U+FFFD that a later token would complete); such text is
held back until complete. For SentencePiece, whose decode strips a text's leading space, the reference is
the output in context (decode(prompt + output) past decode(prompt)): "hello" + " world" keeps its space.

Method (vLLM's prefix/read offsets): decode only a short window, `tokens[prefix_offset:]`, and diff it
against the decode of `tokens[prefix_offset:read_offset]`, so each call costs O(window), not O(length).
The window starts a few tokens inside the prompt so decoders that depend on the left context (leading
spaces of SentencePiece pieces) render the first output token as in a full decode.
"""

from __future__ import annotations

from typing import Any

_REPLACEMENT = "\ufffd"
_PROMPT_CONTEXT = 5  # prompt tokens kept as left context of the first window


class IncrementalDetokenizer:
    """`single_decodes` (optional, shared by the detokenizers of one tokenizer and one
    skip_special_tokens setting): the decode of each one-id window, which is a pure function of that id.
    While a stream emits a token a step, the window diffed against is the one token emitted last, so
    each step then calls the decoder once instead of twice."""

    def __init__(
        self,
        tokenizer: Any,
        prompt_token_ids: list[int] | None = None,
        skip_special_tokens: bool = True,
        single_decodes: dict[int, str] | None = None,
    ):
        self.tokenizer = tokenizer
        self._backend = getattr(tokenizer, "backend", tokenizer)
        self.skip_special_tokens = skip_special_tokens
        self.token_ids: list[int] = list(prompt_token_ids or [])
        self.num_prompt_tokens = len(self.token_ids)
        self.prefix_offset = max(len(self.token_ids) - _PROMPT_CONTEXT, 0)
        self.read_offset = len(self.token_ids)
        self.output_text = ""
        self._single_decodes = single_decodes
        # SentencePiece byte-fallback ids: a run of them decodes as a unit (an invalid run becomes U+FFFD
        # for every byte, valid ASCII included), so text is committed only once a run has ended.
        # Skipped special tokens vanish before the decoder runs, so they do not end a run.
        self._byte_run_ids = getattr(tokenizer, "byte_fallback_ids", frozenset())
        self._skipped_ids = set(getattr(tokenizer, "special_tokens", {})) if skip_special_tokens else set()

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    def _decode(self, ids: list[int]) -> str:
        # The raw `tokenizers` backend when there is one: no per-call id validation, and an id past the
        # vocabulary (models pad their embedding table) decodes to nothing instead of failing a stream.
        return self._backend.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def _decode_prefix(self) -> str:
        ids = self.token_ids[self.prefix_offset : self.read_offset]
        cache = self._single_decodes
        if cache is None or len(ids) != 1:
            return self._decode(ids)
        text = cache.get(ids[0])
        if text is None:
            text = cache[ids[0]] = self._decode(ids)
        return text

    def add_tokens(self, new_token_ids: list[int]) -> str:
        """Append generated ids; return the newly completed text (possibly "")."""
        self.token_ids.extend(new_token_ids)
        if self._byte_run_ids and self._in_byte_run():
            return ""
        prefix_text = self._decode_prefix()
        new_text = self._decode(self.token_ids[self.prefix_offset :])
        # Hold back while the window ends inside a character, or nothing visible was added.
        if len(new_text) <= len(prefix_text) or new_text.endswith(_REPLACEMENT):
            return ""
        delta = new_text[len(prefix_text) :]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.token_ids)
        self.output_text += delta
        return delta

    def _in_byte_run(self) -> bool:
        for token_id in reversed(self.token_ids):
            if token_id not in self._skipped_ids:
                return token_id in self._byte_run_ids
        return False

    def flush(self) -> str:
        """At the end of a sequence: emit held-back text (an incomplete character decodes to U+FFFD)."""
        prefix_text = self._decode_prefix()
        new_text = self._decode(self.token_ids[self.prefix_offset :])
        delta = new_text[len(prefix_text) :] if len(new_text) > len(prefix_text) else ""
        self.prefix_offset = self.read_offset = len(self.token_ids)
        self.output_text += delta
        return delta
