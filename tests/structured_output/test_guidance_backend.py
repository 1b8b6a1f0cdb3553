"""The llguidance backend on its own (no model): each constraint kind accepts the token sequences of
strings it matches and refuses others; bad, unmatchable, deep and slow constraints are refused with
InvalidRequestError on "structured_outputs"; the cache is bounded by count and by size."""

from __future__ import annotations

import json
import threading
import types

import numpy as np
import pytest
import tokenizers

from fdcli_engine.errors import ConfigError, InvalidRequestError
from fdcli_engine.structured_output import StructuredOutputsParams as SO
from fdcli_engine.structured_output import backend as backend_mod
from fdcli_engine.structured_output import guidance
from fdcli_engine.structured_output.guidance import GuidanceBackend
from fdcli_engine.structured_output.json_schema import close_objects
from fdcli_engine.structured_output.lark_check import start_can_end

VOCAB = 512


@pytest.fixture(scope="module")
def tok(tiny_llama_dir):
    tk = tokenizers.Tokenizer.from_file(str(tiny_llama_dir / "tokenizer.json"))
    return types.SimpleNamespace(backend=tk, eos_token_ids={tk.token_to_id("<|im_end|>")})


@pytest.fixture
def backend(tok):
    return GuidanceBackend(tok, VOCAB)


def _eos(tok) -> int:
    return next(iter(tok.eos_token_ids))


def _matches(backend, tok, so: SO, text: str) -> bool:
    """Every token of `text` is allowed by the mask and accepted, and EOS is allowed at the end."""
    m = backend.compile(so).matcher()
    mask = backend.allocate_bitmask(1)
    for t in tok.backend.encode(text, add_special_tokens=False).ids:
        m.fill_bitmask(mask, 0)
        if not (mask[0, t >> 5] >> (t & 31)) & 1 or not m.accept(t):
            return False
    m.fill_bitmask(mask, 0)
    e = _eos(tok)
    return bool((mask[0, e >> 5] >> (e & 31)) & 1)


SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer", "minimum": 0}, "b": {"enum": ["x", "y"]}},
    "required": ["a", "b"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    ("so", "good", "bad"),
    [
        (SO(json=SCHEMA), '{"a":12,"b":"y"}', '{"a":-1,"b":"y"}'),
        (SO(json_object=True), '{"k":[1,2]}', "[1,2]"),
        (SO(regex=r"[0-9]{2}-[a-z]+"), "42-abc", "4-abc"),
        (SO(choice=["red", "green"]), "green", "blue"),
        (SO(grammar='start: "(" start ")" | "x"'), "((x))", "((x)"),
        (SO(grammar='root ::= "a" [0-9]+'), "a123", "ab"),  # GBNF
    ],
    ids=["json", "json_object", "regex", "choice", "lark", "gbnf"],
)
def test_each_kind_accepts_and_refuses(backend, tok, so, good, bad):
    assert _matches(backend, tok, so, good)
    assert not _matches(backend, tok, so, bad)


def test_structural_tag_vllm_format(backend, tok):
    so = SO(
        structural_tag={
            "type": "structural_tag",
            "structures": [{"begin": "<function=f>", "schema": SCHEMA, "end": "</function>"}],
            "triggers": ["<function="],
        }
    )
    assert _matches(backend, tok, so, 'Sure. <function=f>{"a":1,"b":"x"}</function> done')
    assert _matches(backend, tok, so, "no call at all")
    assert not _matches(backend, tok, so, '<function=f>{"a":"one","b":"x"}</function>')


@pytest.mark.parametrize(
    ("so", "message"),
    [
        (SO(regex="(unclosed"), "invalid regex"),
        (SO(regex="a\\"), "incomplete escape"),  # llguidance alone would serve it as /a/
        (SO(regex="\\"), "incomplete escape"),
        (SO(json="{not json"), "invalid json"),
        (SO(json={"type": "integer", "minimum": 5, "maximum": 2}), "Unsatisfiable"),
        (SO(json={"enum": [1, 2], "const": 3}), "Unsatisfiable"),
        (SO(grammar='start: "a" start'), "matches no string"),
        (SO(grammar='start: x\nx: "a" x\n  | "b" x'), "matches no string"),
        (SO(grammar="start: ("), "invalid grammar"),
        # Malformed GBNF: llguidance's converter raises its own error, a bare Exception, an IndexError.
        (SO(grammar="root ::= ("), "invalid grammar: Expected '\\)'"),
        (SO(grammar="root ::= a"), "invalid grammar: Rule 'a' not found"),
        (SO(grammar='x ::= "a"'), "invalid grammar: No 'root' rule found"),
        (SO(grammar='root ::= "\\'), "invalid grammar"),
        (SO(structural_tag={"structures": [], "triggers": ["<f"]}), "structures"),
        (
            SO(structural_tag={"type": "structural_tag", "format": {"type": "const_string", "value": "hi"}}),
            "xgrammar's, which fd does not have",
        ),
        (
            SO(
                structural_tag={"structures": [{"begin": "<g>", "schema": {}, "end": ""}], "triggers": ["<f"]}
            ),
            "triggers",
        ),
    ],
)
def test_bad_constraints_are_refused(backend, so, message):
    with pytest.raises(InvalidRequestError, match=message) as exc:
        backend.compile(so)
    assert exc.value.param == "structured_outputs"


def test_a_refusal_inside_the_compile_is_not_wrapped_twice(backend):
    """InvalidRequestError is a ValueError too (errors.py): the compile's own `except ValueError` must
    pass it through as it is, not prefix it again."""
    with pytest.raises(InvalidRequestError) as exc:
        backend.compile(SO(grammar='start: "a" start'))
    assert str(exc.value).startswith("invalid grammar: it matches no string")
    assert str(exc.value).count("invalid grammar") == 1


def test_deep_schema_is_a_bounded_error(backend):
    deep: dict = {"type": "string"}
    for _ in range(10_000):
        deep = {"type": "object", "properties": {"a": deep}}
    with pytest.raises(InvalidRequestError) as exc:  # the dict cannot even be serialized
        SO(json=deep)
    assert exc.value.param == "structured_outputs"
    text = '{"type":"object","properties":{"a":' * 10_000 + '{"type":"string"}' + "}}" * 10_000
    with pytest.raises(InvalidRequestError, match="recursion"):
        backend.compile(SO(json=text))


def test_compile_wall_clock_bound(backend, monkeypatch):
    """A compile that does not finish within the bound refuses the request (the thread is left)."""
    release = threading.Event()
    real = guidance.llguidance.LLMatcher

    def slow(*args, **kwargs):
        release.wait()
        return real(*args, **kwargs)

    monkeypatch.setattr(guidance.llguidance, "LLMatcher", slow)
    backend.compile_timeout_s = 0.05
    try:
        with pytest.raises(InvalidRequestError, match="compiling the constraint exceeded 0.05 s"):
            backend.compile(SO(regex="[a-z]+"))
    finally:
        release.set()
    assert backend.stats()["compile_errors"] == 1
    assert backend.stats()["cached"] == 0


def _chain(n: int) -> str:
    return "start: r0\n" + "\n".join(f'r{i}: "{i}" r{i + 1}?' for i in range(n)) + f'\nr{n}: "end"'


def test_deeply_nested_rules_compile_without_crashing(backend, tok):
    """A chain of 2 * 10^4 nested rules (an 8 MiB stack overflows at 10^4) compiles and masks."""
    backend.compile_timeout_s = 600  # this test is about the stack, not the clock
    so = SO(grammar=_chain(20_000))
    assert _matches(backend, tok, so, "012")
    assert not _matches(backend, tok, so, "02")


def test_unmatchable_check_is_linear(backend):
    """A 2 * 10^4-rule chain that never ends is refused by the check, not left to llguidance."""
    chain = "start: r0\n" + "\n".join(f'r{i}: "{i}" r{i + 1}' for i in range(20_000)) + '\nr20000: "x" r0'
    assert start_can_end(chain) is False
    with pytest.raises(InvalidRequestError, match="matches no string"):
        backend.compile(SO(grammar=chain))


def test_limits_refuse_a_huge_grammar(backend):
    backend.compile_timeout_s = 600
    with pytest.raises(InvalidRequestError, match="invalid grammar"):
        backend.compile(SO(grammar=_chain(60_000)))


def test_cache_is_bounded_by_count_and_size(backend, tok, monkeypatch):
    schemas = [{"type": "object", "properties": {f"k{i}": {"type": "integer"}}} for i in range(1000)]
    for s in schemas:
        backend.compile(SO(json=s))
    stats = backend.stats()
    assert stats["compiles"] == 1000 and stats["cache_hits"] == 0
    assert stats["cached"] == guidance.CACHE_SIZE
    backend.compile(SO(json=schemas[-1]))  # recent: still cached
    backend.compile(SO(json=schemas[0]))  # evicted: compiled again
    stats = backend.stats()
    assert (stats["cache_hits"], stats["compiles"]) == (1, 1001)

    monkeypatch.setattr(guidance, "CACHE_CHARS", 20_000)
    small = GuidanceBackend(tok, VOCAB)
    for s in schemas[:200]:
        small.compile(SO(json=s))
    stats = small.stats()
    assert 0 < stats["cached_chars"] <= 20_000 and stats["cached"] < 200


def test_matcher_masks_bits_past_the_tokenizer(tok):
    """Ids past the tokenizer's vocabulary (logits wider than it) are never allowed."""
    wide = GuidanceBackend(tok, 600)
    m = wide.compile(SO(regex="[a-z]*")).matcher()
    mask = wide.allocate_bitmask(1)
    m.fill_bitmask(mask, 0)
    bits = np.unpackbits(mask.view(np.uint8), bitorder="little")[:600]
    assert bits[tok.backend.get_vocab_size() :].sum() == 0
    assert bits[: tok.backend.get_vocab_size()].sum() > 0


def test_unmatchable_gbnf_is_refused_and_a_finite_one_served(backend, tok):
    """GBNF is read as the Lark llguidance converts it to, so the same check applies."""
    with pytest.raises(InvalidRequestError, match="matches no string"):
        backend.compile(SO(grammar='root ::= "a" root'))
    assert _matches(backend, tok, SO(grammar='root ::= "a" | "a" root'), "aaa")


def test_unmatchable_check_is_conservative():
    assert start_can_end('start: "a" start') is False
    assert start_can_end('start: ("a" start)+') is False
    assert start_can_end('start: "a" | "b" start') is True
    assert start_can_end('start: ("a" start)* "b"') is True
    assert start_can_end('start: [x] "b"\nx: x') is True
    assert start_can_end('start: x y\nx: "a"\ny: y "b"') is False
    assert start_can_end('start: (x | y)\nx: x\ny: "a" x') is False
    assert start_can_end("start: " + "(" * 5000 + '"a"' + ")" * 5000) is None
    assert start_can_end('root ::= "a" root') is None  # GBNF: not read
    assert start_can_end('start: "a" start | %json {"type": "object"}') is None


def test_backend_names():
    assert backend_mod.get_backend("off", None, VOCAB) is None
    with pytest.raises(ConfigError, match="xgrammar is not available in fd: use guidance"):
        backend_mod.get_backend("xgrammar", None, VOCAB)
    with pytest.raises(ConfigError, match="not known"):
        backend_mod.check_backend_name("outlines")


def test_xgrammar_refused_at_config_validation():
    from fdcli_engine.config import EngineConfig

    with pytest.raises(ConfigError, match="xgrammar is not available"):
        EngineConfig(guided_decoding_backend="xgrammar").validate()
    assert EngineConfig(guided_decoding_backend="off").validate().guided_decoding_backend == "off"


def test_objects_with_properties_are_closed_unless_the_schema_opens_them(backend, tok):
    """xgrammar's strict reading (vLLM's and FastDeploy's default backend): listed properties only,
    unless the schema says otherwise; a property named like a keyword is still a property."""
    listed = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert _matches(backend, tok, SO(json=listed), '{"a":1}')
    assert not _matches(backend, tok, SO(json=listed), '{"a":1,"b":2}')
    opened = dict(listed, additionalProperties=True)
    assert _matches(backend, tok, SO(json=opened), '{"a":1,"b":2}')
    nested = {"type": "array", "items": {"$ref": "#/$defs/p"}, "$defs": {"p": listed}}
    assert not _matches(backend, tok, SO(json=nested), '[{"a":1,"c":3}]')
    assert _matches(backend, tok, SO(json=nested), '[{"a":1}]')
    keyword_named = {"type": "object", "properties": {"properties": {"type": "integer"}}}
    assert _matches(backend, tok, SO(json=keyword_named), '{"properties":3}')
    assert _matches(backend, tok, SO(json={"type": "object"}), '{"any":1}')  # no properties: open


def test_vllm_option_fields_are_accepted_and_keep_the_constraint(backend, tok):
    """vLLM's StructuredOutputsParams takes whitespace / additionalProperties / fallback options next
    to the constraint; vLLM code passing them constructs fd's unchanged, and the output they ask for
    (compact JSON, closed objects) is what fd generates anyway."""
    so = SO(
        json=SCHEMA,
        disable_fallback=True,
        disable_any_whitespace=True,
        disable_additional_properties=True,
        whitespace_pattern=r"[ ]?",
    )
    assert so.kind == "json" and so.spec == SO(json=SCHEMA).spec
    assert _matches(backend, tok, so, '{"a":12,"b":"y"}')
    assert not _matches(backend, tok, so, '{"a": 12, "b": "y"}')
    listed = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert not _matches(backend, tok, SO(json=listed, disable_additional_properties=True), '{"a":1,"b":2}')


def test_thousands_of_choices_match_each_one(backend, tok):
    """llguidance's parser holds at most 2000 items in a row: choices as parser alternatives failed
    at the first token past that; as one lexer terminal each choice matches and nothing else does."""
    many = SO(choice=[f"opt{i}" for i in range(5000)])
    assert _matches(backend, tok, many, "opt4321")
    assert _matches(backend, tok, many, "opt0")
    assert not _matches(backend, tok, many, "opt")
    assert not _matches(backend, tok, many, "opt5000")


def test_choices_with_quotes_newlines_and_unicode_match_as_written(backend, tok):
    so = SO(choice=['say "hi"', "a\nb", "naïve 😀", "back\\slash"])
    for text in so.choice:
        assert _matches(backend, tok, so, text), text
    assert not _matches(backend, tok, so, "say hi")


def test_all_of_branches_are_closed_over_their_names_together(backend, tok):
    """allOf describes one object: closing each branch over its own properties made the conjunction
    unsatisfiable (a 400 for a valid schema); the parts are closed over the names they list together."""
    both = {
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {"properties": {"b": {"type": "string"}}, "required": ["b"]},
        ]
    }
    so = SO(json=both)
    assert _matches(backend, tok, so, '{"a":1,"b":"x"}')
    assert not _matches(backend, tok, so, '{"a":1,"b":2}')  # each part still constrains its names
    assert not _matches(backend, tok, so, '{"a":1,"b":"x","c":3}')  # closed over a and b
    by_ref = {
        "$defs": {"Base": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}},
        "allOf": [{"$ref": "#/$defs/Base"}, {"properties": {"b": {"type": "string"}}, "required": ["b"]}],
    }
    assert _matches(backend, tok, SO(json=by_ref), '{"a":1,"b":"x"}')
    assert not _matches(backend, tok, SO(json=by_ref), '{"a":1,"b":"x","c":3}')
    # Names behind anyOf cannot be known: the parts stay as written (open), none is closed.
    unknowable = {"allOf": [{"anyOf": [{"required": ["a"]}]}, {"properties": {"b": {"type": "string"}}}]}
    assert close_objects(json.loads(json.dumps(unknowable))) == unknowable


def test_an_escaped_trailing_backslash_is_a_backslash(backend, tok):
    assert _matches(backend, tok, SO(regex=r"a\\"), "a\\")
    assert not _matches(backend, tok, SO(regex=r"a\\"), "a")


def _alternatives(n: int, prefix: str = "opt") -> str:
    return " | ".join(f'"{prefix}{i}"' for i in range(n))


@pytest.mark.parametrize(
    "grammar",
    [
        "start: " + _alternatives(3000),
        "start: word\nword: " + _alternatives(3000),
        "root ::= " + _alternatives(3000),  # GBNF
    ],
    ids=["start", "rule", "gbnf"],
)
def test_a_rule_of_thousands_of_alternatives_matches_each_one(backend, tok, grammar):
    """llguidance's default row of 2000 items failed these at the first token (the request then
    ended there, matching nothing); the backend's row limit holds them."""
    so = SO(grammar=grammar)
    for text in ("opt0", "opt2999", "opt1234"):
        assert _matches(backend, tok, so, text), text
    assert not _matches(backend, tok, so, "opt")
    assert not _matches(backend, tok, so, "opt3000")


def test_thousands_of_alternatives_repeated_after_a_separator(backend, tok):
    """The rule is predicted again mid-output, after each comma: each of those rows holds it too."""
    so = SO(grammar='start: word ("," word)*\nword: ' + _alternatives(3000))
    assert _matches(backend, tok, so, "opt7,opt2999,opt0")
    assert not _matches(backend, tok, so, "opt7,opt3000")


def test_json_schema_of_thousands_of_object_branches_matches(backend, tok):
    branch = {"type": "object", "properties": {"k": {"const": 0}}, "required": ["k"]}
    schema = {"anyOf": [{**branch, "properties": {"k": {"const": i}}} for i in range(3000)]}
    assert _matches(backend, tok, SO(json=schema), '{"k":2999}')
    assert not _matches(backend, tok, SO(json=schema), '{"k":3000}')


@pytest.mark.parametrize(
    "grammar",
    [
        "start: a | b\na: " + _alternatives(26_000, "a") + "\nb: " + _alternatives(26_000, "b"),
        'start: "x" ("," word)*\nword: ' + _alternatives(50_001),
        'start: ["x"] (' + _alternatives(50_001) + ")",
    ],
    ids=["two-rules", "rule-after-a-comma", "group-after-an-optional"],
)
def test_more_alternatives_at_once_than_a_row_holds_is_refused(backend, grammar):
    """Past the row limit llguidance would compile the grammar and fail at the first token in that
    row: a 400 up front, naming the rule and saying what to write instead."""
    with pytest.raises(InvalidRequestError, match=r"alternatives at once, over its limit of 50000") as e:
        backend.compile(SO(grammar=grammar))
    assert "one terminal" in str(e.value) and e.value.param == "structured_outputs"


def test_alternatives_as_one_terminal_are_not_refused(backend, tok):
    """The refusal's advice works: a terminal of 60000 strings is one lexeme, however many."""
    backend.compile_timeout_s = 600
    so = SO(grammar="start: word\nword: WORD\nWORD: " + _alternatives(60_000))
    assert _matches(backend, tok, so, "opt59999")
