"""MiniMax-M2's tool-call format (vLLM's "minimax_m2" parser): blocks of invokes,

    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">Paris</parameter>
    <parameter name="days">3</parameter>
    </invoke>
    </minimax:tool_call>

Each complete <invoke> of a closed block is a call (a block or invoke never closed — cut off — is
none, as vLLM reads them). Names may be quoted with " or '. A value is the text between the tags,
edge whitespace removed, converted by vLLM's minimax_m2 rules: "null"/"none"/"nil" (any case) is
null; otherwise the first of integer, number, boolean (true/1/yes/on, false/0/no/off), object/array
(JSON) that the schema's types admit and the value reads as (types from `type`, a type list, an
`enum`'s values, and anyOf/oneOf/allOf branches), else the text as written when a string is
admitted, else JSON, else the text. A parameter the schema does not list (or no tools) is a string.

Content is the text before the first block, None when empty; text between and after blocks is left
out. Arguments stream as vLLM streams them: each parameter once complete, `}` at </invoke>.
"""

from __future__ import annotations

import json
import math

from fdcli_engine.entrypoints.openai.tool_parsers.param_types import json_pair, tool_properties
from fdcli_engine.entrypoints.openai.tool_parsers.reparse_scan import ReadCall, ReparseCallsParser

BLOCK, BLOCK_END = "<minimax:tool_call>", "</minimax:tool_call>"
INVOKE, INVOKE_END = "<invoke name=", "</invoke>"
PARAM, PARAM_END = "<parameter name=", "</parameter>"
_NULLS = ("null", "none", "nil")
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")
_UNREAD = object()


class MinimaxM2ToolParser(ReparseCallsParser):
    start_tag = BLOCK
    tags = (BLOCK, BLOCK_END, INVOKE, INVOKE_END, PARAM, PARAM_END)
    reads_tools = True  # values take the types of the request's tool schemas

    def call_start(self, text: str) -> int:
        return text.find(BLOCK)

    def read_calls(self, region: str, final: bool = True) -> list[ReadCall]:
        """The calls in `region`; not `final`: the invokes of the open block too, each with its
        complete parameters (`}` once it closed)."""
        calls, pos = [], 0
        while (at := region.find(BLOCK, pos)) != -1:
            end = region.find(BLOCK_END, at)
            if end == -1 and final:
                break
            body = region[at + len(BLOCK) : end if end != -1 else len(region)]
            calls += self._invokes(body, open_block=end == -1)
            if end == -1:
                break
            pos = end + len(BLOCK_END)
        return calls

    def _invokes(self, body: str, open_block: bool) -> list[ReadCall]:
        calls, pos = [], 0
        while (at := body.find(INVOKE, pos)) != -1:
            name_end = body.find(">", at + len(INVOKE))
            if name_end == -1:
                break
            name = _unquote(body[at + len(INVOKE) : name_end])
            end = body.find(INVOKE_END, name_end)
            if end == -1 and not open_block:
                break  # an invoke its block closed without closing it: no call
            inner = body[name_end + 1 : end if end != -1 else len(body)]
            props = tool_properties(self.tools, name)
            pairs = [json_pair(key, _convert(value, props.get(key))) for key, value in _params(inner)]
            if name:
                calls.append(ReadCall(name, "{" + ", ".join(pairs) + ("}" if end != -1 else "")))
            if end == -1:
                break
            pos = end + len(INVOKE_END)
        return calls


def _unquote(name: str) -> str:
    name = name.strip()
    if len(name) >= 2 and name[0] == name[-1] and name[0] in "\"'":
        return name[1:-1]
    return name


def _params(inner: str) -> list[tuple[str, str]]:
    """The complete `<parameter name=…>value</parameter>` pairs of an invoke, in order."""
    pairs, pos = [], 0
    while (at := inner.find(PARAM, pos)) != -1:
        end = inner.find(PARAM_END, at)
        if end == -1:
            break
        name, sep, value = inner[at + len(PARAM) : end].partition(">")
        if sep and name.strip():
            pairs.append((_unquote(name), value.strip()))
        pos = end + len(PARAM_END)
    return pairs


def _types(schema) -> set[str]:
    """Every type a parameter schema admits (lower-cased): `type`, an enum's values' types, and
    the anyOf/oneOf/allOf branches'; {"string"} when it names none."""
    if not isinstance(schema, dict):
        return {"string"}
    found: set[str] = set()
    kinds = schema.get("type")
    found.update(k.lower() for k in (kinds if isinstance(kinds, list) else [kinds]) if isinstance(k, str))
    if isinstance(schema.get("enum"), list):
        found.update(_json_type(value) for value in schema["enum"])
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list):
            found.update(t for branch in schema[key] for t in _types(branch))
    return found or {"string"}


def _json_type(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), "string")


def _convert(value: str, schema):
    if value.lower() in _NULLS:
        return None
    types = _types(schema) if schema is not None else {"string"}
    for kind in (
        "integer",
        "int",
        "number",
        "float",
        "boolean",
        "bool",
        "object",
        "array",
        "string",
        "str",
        "text",
    ):
        if kind not in types:
            continue
        read = _read(value, kind)
        if read is not _UNREAD:
            return read
    read = _read(value, "object")
    return value if read is _UNREAD else read


def _read(value: str, kind: str):
    if kind in ("string", "str", "text"):
        return value
    if kind in ("integer", "int"):
        try:
            return int(value)
        except ValueError:
            return _UNREAD
    if kind in ("number", "float"):
        try:
            number = float(value)
        except ValueError:
            return _UNREAD
        return _UNREAD if not math.isfinite(number) else int(number) if number == int(number) else number
    if kind in ("boolean", "bool"):
        low = value.lower()
        return True if low in _TRUE else False if low in _FALSE else _UNREAD
    try:
        parsed = json.loads(value)
        json.dumps(parsed, allow_nan=False)
    except (ValueError, RecursionError):
        return _UNREAD
    return parsed
