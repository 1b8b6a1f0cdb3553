"""Whether a Lark grammar can end at all: a rule is productive when one of its alternatives is made
only of productive items, and `start: "a" start` is not. llguidance accepts such a grammar and then
lets the model write "a" until max_tokens; this check lets the backend refuse it instead.

Conservative by construction: it only answers False for grammars it fully reads (rules, terminals,
strings, regexes, groups, optionals and quantifiers); anything else (llguidance's %json, token
references, sub-grammars, GBNF) gives None, "unknown", and the grammar is used as is.
"""

from __future__ import annotations

import re

_RULE_HEAD = re.compile(r"^\s*[?!]?([A-Za-z_]\w*)(?:\[[^\]\n]*\])?(?:\.-?\d+)?\s*:(?!:)", re.MULTILINE)
_TOKEN = re.compile(
    r"""\s+|//[^\n]*|(?P<str>"(?:[^"\\\n]|\\.)*"i?)|(?P<re>/(?:[^/\\\n]|\\.)+/[imslux]*)"""
    r"""|(?P<name>[?!]?[A-Za-z_]\w*)|(?P<op>\.\.|[|()\[\]?*+])|(?P<rep>~\s*\d+(?:\s*\.\.\s*\d+)?)"""
)


class _Unknown(Exception):
    pass


def _tokens(body: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(body):
        m = _TOKEN.match(body, pos)
        if m is None:
            raise _Unknown
        pos = m.end()
        if m.lastgroup is not None:
            out.append((m.lastgroup, m.group(m.lastgroup)))
    return out


def _parse_alt(toks: list, i: int) -> tuple[list, int]:
    """alternatives: [[item, ...], ...]; an item is ("atom", None) | ("name", n) | ("group", alts, optional)."""
    alts, seq = [], []
    while i < len(toks):
        kind, text = toks[i]
        if kind == "op" and text == "|":
            alts.append(seq)
            seq, i = [], i + 1
            continue
        if kind == "op" and text in ")]":
            break
        if kind in ("str", "re"):
            item, i = ("atom", None), i + 1
        elif kind == "name":
            item, i = ("name", text.lstrip("?!")), i + 1
        elif kind == "op" and text in "([":
            inner, j = _parse_alt(toks, i + 1)
            close = ")" if text == "(" else "]"
            if j >= len(toks) or toks[j] != ("op", close):
                raise _Unknown
            item, i = ("group", inner, text == "["), j + 1
        elif kind == "op" and text == "..":
            i += 1  # "a".."z": both ends are strings, productive either way
            continue
        else:
            raise _Unknown
        # Quantifiers: ? and * (and ~0) make the item optional; + and ~n keep it required.
        optional = False
        while i < len(toks) and (toks[i][0] == "rep" or toks[i] in (("op", "?"), ("op", "*"), ("op", "+"))):
            kind, text = toks[i]
            if text in ("?", "*") or (kind == "rep" and re.match(r"~\s*0(?:\s*\.\.|\s*$)", text)):
                optional = True
            i += 1
        seq.append(("opt", item) if optional else item)
    alts.append(seq)
    return alts, i


def _productive(alts: list, known: set[str], defined: set[str]) -> bool:
    return any(all(_item_ok(item, known, defined) for item in seq) for seq in alts)


def _item_ok(item, known: set[str], defined: set[str]) -> bool:
    if item[0] in ("atom", "opt"):
        return True
    if item[0] == "name":
        return item[1] in known or item[1] not in defined  # an undefined name: not ours to judge
    _, inner, optional = item
    return optional or _productive(inner, known, defined)


def start_can_end(grammar: str) -> bool | None:
    """False when rule `start` can never derive a finite string; None when the grammar is not read."""
    # GBNF's "::=" heads, directives (%ignore, %json), sub-grammars (@x) and token references (<...>)
    # outside strings do not parse below: None.
    heads = list(_RULE_HEAD.finditer(grammar))
    if not heads or grammar[: heads[0].start()].strip():
        return None
    rules: dict[str, list] = {}
    try:
        for k, head in enumerate(heads):
            end = heads[k + 1].start() if k + 1 < len(heads) else len(grammar)
            toks = _tokens(grammar[head.end() : end])
            alts, i = _parse_alt(toks, 0)
            if i != len(toks):
                raise _Unknown
            rules.setdefault(head.group(1), []).extend(alts)
    except _Unknown:
        return None
    if "start" not in rules:
        return None
    defined, known = set(rules), set()
    changed = True
    while changed:
        changed = False
        for name, alts in rules.items():
            if name not in known and _productive(alts, known, defined):
                known.add(name)
                changed = True
    return "start" in known
