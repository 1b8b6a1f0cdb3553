"""The llguidance grammar backend: JSON schemas, regexes, choices, Lark / GBNF grammars and
structural tags compiled by llguidance, masks written with its numpy bitmask API (no torch).

Compiled grammars are kept in an LRU cache keyed by (kind, spec), bounded by count (CACHE_SIZE) and by
the total size of their grammar text (CACHE_CHARS); a request's matcher is a deep copy of the cached
one, so a repeated schema costs no compilation.

Compile budget: llguidance's parser limits (LIMITS) refuse an oversized grammar or lexer, and one
compile may take at most COMPILE_TIMEOUT_S of wall time (it runs on a thread of its own; past the bound
the request is refused and the thread's result, when it comes, is dropped). A grammar whose start rule
can never end (`start: "a" start`) and an unsatisfiable schema are refused too.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict

import llguidance
import llguidance.numpy as llg_numpy
import numpy as np
from llguidance.gbnf_to_lark import any_to_lark

from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.structured_output.json_schema import close_objects
from fdcli_engine.structured_output.lark_check import read_lark, start_can_end
from fdcli_engine.structured_output.lark_rows import crowded_rule
from fdcli_engine.structured_output.params import StructuredOutputsParams

CACHE_SIZE = 256  # compiled grammars kept
CACHE_CHARS = 32 << 20  # total grammar text the cache holds; a bigger grammar is compiled, not kept
COMPILE_TIMEOUT_S = 2.0
# The header any_to_lark writes on a converted GBNF grammar; the productivity check reads plain Lark.
_EMPTY_DIRECTIVE = "%llguidance {}"
# llguidance's compile recurses once per nested rule: a chain of 10^4 rules overflows an 8 MiB stack
# and kills the process (SIGSEGV). Its symbol table (< 2^16 symbols) bounds the depth, which this
# stack holds; it is reserved address space, touched only as deep as a grammar goes.
COMPILE_STACK_BYTES = 512 << 20
_STACK_LOCK = threading.Lock()  # threading.stack_size is process-wide
# Tighter than llguidance's defaults where a request could make the core build something huge.
# A row of the Earley parser may hold as many items as one mask step may build (llguidance's default
# step budget): its default of 2000 failed a rule of 3000 alternatives at the first token.
ROW_ITEMS = 50_000
LIMITS = dict(
    max_grammar_size=200_000,
    max_lexer_states=100_000,
    initial_lexer_fuel=1_000_000,
    max_items_in_row=ROW_ITEMS,
    step_max_items=ROW_ITEMS,
)


def _error(message: str) -> InvalidRequestError:
    return InvalidRequestError(message, param="structured_outputs")


def grammar_text(params: StructuredOutputsParams) -> str:
    """llguidance's grammar for the constraint; InvalidRequestError when it cannot be read."""
    kind = params.kind
    try:
        if kind == "json":
            schema = json.dumps(close_objects(json.loads(params.json)))
            return llguidance.LLMatcher.grammar_from_json_schema(
                schema, defaults={"whitespace_flexible": False}
            )
        if kind == "json_object":
            return llguidance.LLMatcher.grammar_from_json_schema(
                '{"type": "object"}', defaults={"whitespace_flexible": False}
            )
        if kind == "regex":
            # llguidance drops a trailing lone backslash when it writes the regex into Lark (`a\`
            # became /a/, `\` the empty regex): an incomplete escape is refused here instead.
            if (len(params.regex) - len(params.regex.rstrip("\\"))) % 2:
                raise _error("invalid regex: it ends with an incomplete escape (a lone backslash)")
            return llguidance.grammar_from("regex", params.regex)
        if kind == "choice":
            return llguidance.LLMatcher.grammar_from_lark(_choice_lark(params.choice))
        if kind == "grammar":
            lark = _to_lark(params.grammar)
            parsed = read_lark(lark.replace(_EMPTY_DIRECTIVE, "", 1))  # None: not one the checks read
            if start_can_end(parsed) is False:
                raise _error("invalid grammar: it matches no string (rule start can never end)")
            _check_rows(parsed)
            return llguidance.LLMatcher.grammar_from_lark(lark)
        if kind == "structural_tag":
            return _structural_tag_grammar(params.structural_tag)
    except InvalidRequestError:  # already says what is wrong (a ValueError too: errors.py)
        raise
    except (ValueError, TypeError, KeyError, AssertionError, RecursionError) as exc:
        raise _error(f"invalid {kind}: {exc}") from None
    raise _error(f"the {kind} constraint is not supported by the guidance backend")


def _choice_lark(choices: list[str]) -> str:
    """The choices as one terminal, so llguidance's lexer (a DFA) matches them, however many.
    grammar_from("choice") makes each one an alternative of the parser's start rule instead, and the
    Earley parser refuses a row of over 2000 items (its max_items_in_row) only when the first token
    is consumed: 5000 choices compiled, then every request ended after one token, matching none."""
    return "start: CHOICE\nCHOICE: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def _check_rows(parsed: dict[str, list] | None) -> None:
    """Refuse a grammar whose rule predicts more alternatives at once than a parser row holds:
    llguidance would compile it and then end the request at its first token."""
    crowded = crowded_rule(parsed, ROW_ITEMS)
    if crowded is not None:
        rule, items = crowded
        raise _error(
            f"invalid grammar: rule {rule} makes the parser hold {items} alternatives at once, over its "
            f"limit of {ROW_ITEMS}; write alternatives that are plain strings as one terminal instead "
            '(WORD: "a" | "b" | ..., used as word: WORD): its lexer matches any number of them'
        )


def _to_lark(grammar: str) -> str:
    """The grammar as Lark: GBNF / EBNF converted, Lark as it is. The converter is a Python parser
    that raises its own GbnfToLarkError, a bare Exception ("No 'root' rule found") or an IndexError on
    malformed GBNF; any of them is the request's bad grammar, never the server's fault."""
    try:
        return any_to_lark(grammar)
    except Exception as exc:  # noqa: BLE001 - see above: all of them mean "not a readable grammar"
        raise _error(f"invalid grammar: {exc}") from None


def _structural_tag_grammar(spec: str) -> str:
    """vLLM's structural tag, {"type": "structural_tag", "structures": [{"begin", "schema", "end"}],
    "triggers": [...]}: free text, where each structure starts at one of the triggers (its `begin` must
    start with one), then its schema's JSON, then its `end`."""
    tag = json.loads(spec)
    if isinstance(tag, dict) and "format" in tag and "structures" not in tag:
        # xgrammar's newer form (vLLM reads it with xgrammar only; its guidance backend wants these).
        raise ValueError(
            'the "format" form of a structural tag is xgrammar\'s, which fd does not have: give '
            '"structures" ([{"begin", "schema", "end"}]) and "triggers" instead'
        )
    if not isinstance(tag, dict) or not isinstance(tag.get("structures"), list) or not tag["structures"]:
        raise ValueError('a structural tag needs a non-empty "structures" list')
    triggers = tag.get("triggers")
    if not isinstance(triggers, list) or not triggers or not all(isinstance(t, str) and t for t in triggers):
        raise ValueError('a structural tag needs a non-empty "triggers" list of strings')
    tags = []
    for s in tag["structures"]:
        if (
            not isinstance(s, dict)
            or not isinstance(s.get("begin"), str)
            or not isinstance(s.get("end"), str)
        ):
            raise ValueError('each structure needs "begin" and "end" strings and a "schema"')
        trigger = next((t for t in triggers if s["begin"].startswith(t)), None)
        if trigger is None:
            raise ValueError(f"structure begin {s['begin']!r} starts with none of the triggers {triggers}")
        schema = s.get("schema", {})
        if not isinstance(schema, dict | bool):
            raise ValueError("a structure's schema must be a JSON schema object")
        # The schema itself, not llguidance's {"grammars": ...} envelope (read as an empty schema).
        grammar = close_objects(schema)
        tags.append(llguidance.StructTag(trigger=trigger, begin=s["begin"], grammar=grammar, end=s["end"]))
    return llguidance.StructTag.to_grammar(tags)


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

    def __init__(self, tokenizer, vocab_size: int, compile_timeout_s: float = COMPILE_TIMEOUT_S):
        self.vocab_size = vocab_size
        self.compile_timeout_s = compile_timeout_s
        self.tokenizer = llguidance.LLTokenizer(
            tokenizer.backend.to_str(), n_vocab=vocab_size, eos_token=sorted(tokenizer.eos_token_ids)
        )
        self._limits = llguidance.LLParserLimits(**LIMITS, verbose_errors=False)
        self._cache: OrderedDict[tuple[str, str], tuple[GuidanceGrammar, int]] = OrderedDict()
        self._cache_chars = 0
        self._lock = threading.Lock()
        # Counters for metrics and the benchmark (read with stats()).
        self.num_compiles = 0
        self.num_cache_hits = 0
        self.num_compile_errors = 0
        self.compile_seconds = 0.0

    def stats(self) -> dict:
        with self._lock:
            return {
                "compiles": self.num_compiles,
                "cache_hits": self.num_cache_hits,
                "compile_errors": self.num_compile_errors,
                "compile_seconds": self.compile_seconds,
                "cached": len(self._cache),
                "cached_chars": self._cache_chars,
            }

    def compile(self, params: StructuredOutputsParams) -> GuidanceGrammar:
        key = (params.kind, params.spec)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                self.num_cache_hits += 1
                return hit[0]
        t0 = time.perf_counter()
        try:
            text = grammar_text(params)
            grammar = self._compile_bounded(params.kind, text)
        except InvalidRequestError:
            with self._lock:
                self.num_compile_errors += 1
            raise
        finally:
            with self._lock:
                self.num_compiles += 1
                self.compile_seconds += time.perf_counter() - t0
        self._keep(key, grammar, len(text) + len(params.spec))
        return grammar

    def _compile_bounded(self, kind: str, text: str) -> GuidanceGrammar:
        """The matcher built on a thread of its own, waited for at most compile_timeout_s."""
        result: list = []

        def build() -> None:
            try:
                result.append(llguidance.LLMatcher(self.tokenizer, text, log_level=0, limits=self._limits))
            except Exception as exc:  # surfaced below as the request's error
                result.append(exc)

        worker = threading.Thread(target=build, name="fd-grammar-compile", daemon=True)
        with _STACK_LOCK:
            previous = threading.stack_size(COMPILE_STACK_BYTES)
            try:
                worker.start()
            except RuntimeError:  # the big stack refused (strict overcommit): the default one
                threading.stack_size(previous)
                worker = threading.Thread(target=build, name="fd-grammar-compile", daemon=True)
                worker.start()
            finally:
                threading.stack_size(previous)
        worker.join(self.compile_timeout_s)
        if not result:
            raise _error(
                f"compiling the constraint exceeded {self.compile_timeout_s:g} s: simplify the {kind}"
            )
        matcher = result[0]
        if isinstance(matcher, Exception):
            raise _error(f"invalid {kind}: {matcher}")
        if matcher.is_error():
            raise _error(f"invalid {kind}: {matcher.get_error()}")
        return GuidanceGrammar(matcher)

    def _keep(self, key: tuple[str, str], grammar: GuidanceGrammar, size: int) -> None:
        if size > CACHE_CHARS:
            return
        with self._lock:
            old = self._cache.pop(key, None)
            if old is not None:
                self._cache_chars -= old[1]
            self._cache[key] = (grammar, size)
            self._cache_chars += size
            while len(self._cache) > CACHE_SIZE or self._cache_chars > CACHE_CHARS:
                _, (_, dropped) = self._cache.popitem(last=False)
                self._cache_chars -= dropped

    def allocate_bitmask(self, num_rows: int) -> np.ndarray:
        return llg_numpy.allocate_token_bitmask(num_rows, self.vocab_size)


__all__ = ["GuidanceBackend", "grammar_text"]
