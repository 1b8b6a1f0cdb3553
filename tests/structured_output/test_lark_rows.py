"""crowded_rule: the alternatives a Lark grammar makes llguidance's parser hold in one row, counted as
llguidance's own error counts them ("Current row has N items") where the test can see that."""

from __future__ import annotations

import llguidance
import pytest
import tokenizers

from fdcli_engine.structured_output.lark_rows import crowded_rule


def _alts(n: int, prefix: str) -> str:
    return " | ".join(f'"{prefix}{i}"' for i in range(n))


def _llguidance_row_error(tiny_llama_dir, grammar: str, text: str, limit: int) -> str:
    tk = tokenizers.Tokenizer.from_file(str(tiny_llama_dir / "tokenizer.json"))
    ll = llguidance.LLTokenizer(tk.to_str(), n_vocab=512, eos_token=[tk.token_to_id("<|im_end|>")])
    limits = llguidance.LLParserLimits(max_items_in_row=limit, verbose_errors=False)
    m = llguidance.LLMatcher(ll, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0, limits=limits)
    for t in tk.encode(text, add_special_tokens=False).ids:
        if not m.consume_token(t):
            return m.get_error()
    return ""


@pytest.mark.parametrize(
    ("grammar", "text", "rule"),
    [
        ("start: a | b\na: " + _alts(30, "a") + "\nb: " + _alts(30, "b"), "a5", "start"),
        ('start: "q" ("," c)*\nc: ' + _alts(70, "c"), "q,c1", "c"),
        ('start: ["q"] (' + _alts(70, "g") + ")", "g1", "start"),
    ],
    ids=["siblings", "predicted-mid-output", "group-after-optional"],
)
def test_a_crowded_grammar_is_one_llguidance_refuses_at_that_limit(tiny_llama_dir, grammar, text, rule):
    found = crowded_rule(grammar, 50)
    assert found is not None and found[0] == rule and found[1] > 50
    assert "Current row has" in _llguidance_row_error(tiny_llama_dir, grammar, text, 50)


@pytest.mark.parametrize(
    ("grammar", "text"),
    [
        ("start: a b\na: " + _alts(30, "a") + "\nb: " + _alts(30, "b"), "a5b7"),  # b comes after a
        ('start: "q"\nunused: ' + _alts(70, "u"), "q"),
        ("start: WORD\nWORD: " + _alts(70, "w"), "w3"),  # one lexeme
        ("start: r0\n" + "\n".join(f'r{i}: r{i + 1} | "a"' for i in range(20)) + '\nr20: "b"', "a"),
    ],
    ids=["sequence", "unused-rule", "terminal", "short-chain"],
)
def test_grammars_within_the_limit_are_not_crowded(tiny_llama_dir, grammar, text):
    assert crowded_rule(grammar, 50) is None
    assert _llguidance_row_error(tiny_llama_dir, grammar, text, 50) == ""


def test_a_chain_of_rules_adds_up(tiny_llama_dir):
    """Each rule that can start the one above it is predicted with it: 30 rules of 2 alternatives."""
    chain = "start: r0\n" + "\n".join(f'r{i}: r{i + 1} | "a"' for i in range(30)) + '\nr30: "b"'
    found = crowded_rule(chain, 50)
    assert found is not None and found[1] > 50
    assert "Current row has" in _llguidance_row_error(tiny_llama_dir, chain, "a", 50)


def test_unread_grammars_are_not_judged():
    assert crowded_rule('%ignore " "\nstart: ' + _alts(70, "x"), 50) is None
    assert crowded_rule("root ::= " + _alts(70, "x"), 50) is None  # GBNF: converted to Lark first
