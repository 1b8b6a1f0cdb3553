"""The pythonic tool-call format (vLLM's "pythonic" parser: Llama 3.2 / Llama 4 and ToolACE-style
models): the whole answer is a Python list of calls with keyword arguments,

    [get_weather(city="Paris", unit="c"), now()]

optionally between Llama 4's `<|python_start|>` and `<|python_end|>`. It is parsed with `ast` and
only literals are accepted (strings, numbers, booleans, None, lists, tuples, dicts): nothing is
evaluated. An answer longer than MAX_CHARS or nested deeper than MAX_DEPTH is not parsed (content),
which bounds the parser's time and stack. Anything else stays content; a call answer has no content.
Calls are sent whole when the output ends (their arguments are converted to JSON, not streamed).
"""

from __future__ import annotations

import ast
import json

from fdcli_engine.entrypoints.openai.parsed_output import ParsedOutput, new_call_id, new_tool_call

PY_START, PY_END = "<|python_start|>", "<|python_end|>"
MAX_CHARS = 1 << 16
MAX_DEPTH = 32


class PythonicToolParser:
    start_tag = "["
    tags = (PY_START, PY_END)
    reads_answer = True
    new_id = staticmethod(new_call_id)

    def call_start(self, text: str) -> int:
        body = text.lstrip()
        return len(text) - len(body) if body.startswith(("[", PY_START)) else -1

    def extract(self, text: str) -> ParsedOutput:
        body = text.strip()
        if body.startswith(PY_START):
            body = body[len(PY_START) :].removesuffix(PY_END).strip()
        calls = _parse(body) if body.startswith("[") and body.endswith("]") else None
        if not calls:
            return ParsedOutput(None, text)
        return ParsedOutput(None, None, [new_tool_call(name, args) for name, args in calls])


def _parse(body: str) -> list[tuple[str, str]] | None:
    if len(body) > MAX_CHARS or _depth(body) > MAX_DEPTH:
        return None
    try:
        tree = ast.parse(body, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls = []
    for node in tree.elts:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            return None  # only name(keyword=literal, ...)
        args = {}
        for kw in node.keywords:
            if kw.arg is None:  # **kwargs
                return None
            try:
                args[kw.arg] = ast.literal_eval(kw.value)
            except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
                return None
        try:
            calls.append((node.func.id, json.dumps(args, ensure_ascii=False, allow_nan=False)))
        except (TypeError, ValueError):  # a literal JSON cannot carry (a set, bytes, a complex number)
            return None
    return calls


def _depth(body: str) -> int:
    """The deepest bracket nesting, counted without parsing (brackets in strings count too: a bound,
    not a measure)."""
    depth = deepest = 0
    for c in body:
        if c in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in ")]}":
            depth -= 1
    return deepest
