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


def _flatten(name: str, alts: list, rules: dict[str, list[list]]) -> None:
    """rules[name] = alternatives as lists of the names each one requires; a group becomes a rule of
    its own ("(group n)"), an optional item or a literal requires nothing."""
    flat = []
    for seq in alts:
        needed = []
        for item in seq:
            if item[0] == "name":
                needed.append(item[1])
            elif item[0] == "group" and not item[2]:
                sub = f"(group {len(rules)})"
                rules[sub] = []
                _flatten(sub, item[1], rules)
                needed.append(sub)
        flat.append(needed)
    rules[name] = flat


def _productive_rules(rules: dict[str, list[list]]) -> set[str]:
    """The rules that derive a finite string: a worklist, linear in the grammar's size."""
    known: set[str] = set()
    users: dict[str, list[tuple[str, list]]] = {}
    queue = []
    for name, alts in rules.items():
        for needed in alts:
            # An undefined name (llguidance would have refused it) is not ours to judge: productive.
            names = {n for n in needed if n in rules and n != name} if name not in needed else None
            if names is None:
                continue  # requires itself: never the alternative that ends the recursion
            count = [len(names)]
            for n in names:
                users.setdefault(n, []).append((name, count))
            if not names and name not in known:
                known.add(name)
                queue.append(name)
    while queue:
        for user, count in users.get(queue.pop(), ()):
            count[0] -= 1
            if count[0] == 0 and user not in known:
                known.add(user)
                queue.append(user)
    return known


def read_lark(grammar: str) -> dict[str, list] | None:
    """Each rule's (and terminal's) alternatives as _parse_alt writes them; None when the grammar is
    not one this module fully reads."""
    # GBNF's "::=" heads, directives (%ignore, %json), sub-grammars (@x) and token references (<...>)
    # outside strings do not parse below: None.
    heads = list(_RULE_HEAD.finditer(grammar))
    if not heads or grammar[: heads[0].start()].strip():
        return None
    parsed: dict[str, list] = {}
    try:
        for k, head in enumerate(heads):
            end = heads[k + 1].start() if k + 1 < len(heads) else len(grammar)
            toks = _tokens(grammar[head.end() : end])
            alts, i = _parse_alt(toks, 0)
            if i != len(toks):
                raise _Unknown
            parsed.setdefault(head.group(1), []).extend(alts)
    except (_Unknown, RecursionError):  # deep nesting: llguidance's own limit reports it
        return None
    return parsed if "start" in parsed else None


def start_can_end(grammar: str | dict[str, list] | None) -> bool | None:
    """False when rule `start` can never derive a finite string; None when the grammar is not read.
    `grammar`: its text, or read_lark's reading of it."""
    parsed = read_lark(grammar) if isinstance(grammar, str) else grammar
    if parsed is None:
        return None
    rules: dict[str, list[list]] = dict.fromkeys(parsed, [])
    try:
        for name, alts in parsed.items():
            _flatten(name, alts, rules)
    except RecursionError:
        return None
    return "start" in _productive_rules(rules)
