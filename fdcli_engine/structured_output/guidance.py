"""The llguidance grammar backend: JSON schemas, regexes, choices, Lark / GBNF grammars and
structural tags compiled by llguidance, masks written with its numpy bitmask API (no torch).

Compiled grammars are kept in a bounded LRU cache keyed by (kind, spec); a request's matcher is a
deep copy of the cached one, so a repeated schema costs no compilation.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import llguidance
import llguidance.numpy as llg_numpy
import numpy as np

from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.structured_output.params import StructuredOutputsParams

CACHE_SIZE = 256  # compiled grammars kept


def _error(message: str) -> InvalidRequestError:
    return InvalidRequestError(message, param="structured_outputs")


def grammar_text(params: StructuredOutputsParams) -> str:
    """llguidance's grammar for the constraint; InvalidRequestError when it cannot be read."""
    kind = params.kind
    try:
        if kind == "json":
            return llguidance.LLMatcher.grammar_from_json_schema(
                params.json, defaults={"whitespace_flexible": False}
            )
        if kind == "json_object":
            return llguidance.LLMatcher.grammar_from_json_schema(
                '{"type": "object"}', defaults={"whitespace_flexible": False}
            )
        if kind == "regex":
            return llguidance.grammar_from("regex", params.regex)
        if kind == "choice":
            return llguidance.grammar_from("choice", params.choice)
        if kind == "grammar":
            return llguidance.grammar_from("grammar", params.grammar)
    except (ValueError, TypeError) as exc:
        raise _error(f"invalid {kind}: {exc}") from None
    raise _error(f"the {kind} constraint is not supported by the guidance backend")


class GuidanceMatcher:
    def __init__(self, matcher: llguidance.LLMatcher):
        self._m = matcher

    def accept(self, token_id: int) -> bool:
        return self._m.consume_token(token_id)

    def fill_bitmask(self, bitmask: np.ndarray, row: int) -> None:
        llg_numpy.fill_next_token_bitmask(self._m, bitmask, row)

    def is_terminated(self) -> bool:
        return self._m.is_stopped()

    def rollback(self, num_tokens: int) -> None:
        self._m.rollback(num_tokens)


class GuidanceGrammar:
    def __init__(self, matcher: llguidance.LLMatcher):
        self._template = matcher

    def matcher(self) -> GuidanceMatcher:
        return GuidanceMatcher(self._template.deep_copy())


class GuidanceBackend:
    name = "guidance"

    def __init__(self, tokenizer, vocab_size: int):
        self.vocab_size = vocab_size
        self.tokenizer = llguidance.LLTokenizer(
            tokenizer.backend.to_str(), n_vocab=vocab_size, eos_token=sorted(tokenizer.eos_token_ids)
        )
        self._cache: OrderedDict[tuple[str, str], GuidanceGrammar] = OrderedDict()
        self._lock = threading.Lock()

    def compile(self, params: StructuredOutputsParams) -> GuidanceGrammar:
        key = (params.kind, params.spec)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        matcher = llguidance.LLMatcher(self.tokenizer, grammar_text(params), log_level=0)
        if matcher.is_error():
            raise _error(f"invalid {params.kind}: {matcher.get_error()}")
        grammar = GuidanceGrammar(matcher)
        with self._lock:
            self._cache[key] = grammar
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return grammar

    def allocate_bitmask(self, num_rows: int) -> np.ndarray:
        return llg_numpy.allocate_token_bitmask(num_rows, self.vocab_size)


__all__ = ["GuidanceBackend", "grammar_text"]
