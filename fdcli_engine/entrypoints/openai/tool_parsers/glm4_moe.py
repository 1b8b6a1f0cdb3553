"""GLM-4.5 / GLM-4.6 / GLM-4.7's tool-call format (vLLM's "glm45" and "glm47" parsers): each call a
block of the function's name and key/value pairs,

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Beijing</arg_value>
    </tool_call>

(GLM-4.7 may write `<arg_key>` right after the name, and a literal `\\n` between a key and its value).
The name ends at the first newline or <arg_key> (vLLM's glm45 needs the newline). A value whose
parameter the request's tool schema types "string" is kept exactly as written; any other is read as
JSON, else as a Python literal (literals only: nothing is evaluated), else kept as text with its
edge whitespace removed, as vLLM does (a value JSON cannot carry stays text).

The blocks follow delimited_calls.py's rules with <tool_call> itself opening the calls (a block never
closed by </tool_call> is no call). Arguments stream as vLLM streams them: each pair once complete,
a string value as it grows, `}` at </tool_call>.
"""

from __future__ import annotations

import ast
import json
import re

from fdcli_engine.entrypoints.openai.parsed_output import partial_tag_len
from fdcli_engine.entrypoints.openai.tool_parsers.delimited_calls import DelimitedCallsParser
from fdcli_engine.entrypoints.openai.tool_parsers.param_types import tool_properties
from fdcli_engine.entrypoints.openai.tool_parsers.reparse_scan import ReadCall

KEY, KEY_END, VALUE, VALUE_END = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"
_BETWEEN = re.compile(r"(?:\\n|\s)*")  # what may stand between a key and its value


class Glm4MoeToolParser(DelimitedCallsParser):
    section_begins = ("<tool_call>",)
    call_begin, call_end = "<tool_call>", "</tool_call>"
    inner_tags = (KEY, KEY_END, VALUE, VALUE_END)
    reads_tools = True  # string-typed values are kept as written

    def _call(self, block: str, closed: bool) -> ReadCall | None:
        cuts = [i for i in (block.find("\n"), block.find(KEY)) if i != -1]
        if not cuts and not closed:
            return None  # the name may go on
        name = block[: min(cuts, default=len(block))].strip()
        if not name:
            return None
        props = tool_properties(self.tools, name)
        pairs, pos = [], min(cuts, default=len(block))
        while (key_at := block.find(KEY, pos)) != -1:
            key_end = block.find(KEY_END, key_at)
            if key_end == -1:
                break
            value_at = _BETWEEN.match(block, key_end + len(KEY_END)).end()
            if not block.startswith(VALUE, value_at):
                pos = key_end + len(KEY_END)  # a key without its value: not a pair
                continue
            value_at += len(VALUE)
            value_end = block.find(VALUE_END, value_at)
            key = block[key_at + len(KEY) : key_end].strip()
            is_text = _is_string(props, key)
            if value_end == -1:
                if not closed and is_text:  # a string value streams as it grows
                    partial = block[value_at:]
                    partial = partial[: len(partial) - partial_tag_len(partial, (VALUE_END,))]
                    pairs.append(
                        json.dumps(key, ensure_ascii=False)
                        + ": "
                        + json.dumps(partial, ensure_ascii=False)[:-1]
                    )
                    return ReadCall(name, "{" + ", ".join(pairs))
                break
            value = block[value_at:value_end]
            pairs.append(f"{json.dumps(key, ensure_ascii=False)}: {_value_json(value, is_text)}")
            pos = value_end + len(VALUE_END)
        return ReadCall(name, "{" + ", ".join(pairs) + ("}" if closed else ""))


def _is_string(props: dict, key: str) -> bool:
    schema = props.get(key)
    return isinstance(schema, dict) and schema.get("type") == "string"


def _value_json(value: str, is_text: bool) -> str:
    if is_text:
        return json.dumps(value, ensure_ascii=False)
    text = value.strip()
    for read in (json.loads, ast.literal_eval):
        try:
            return json.dumps(read(text), ensure_ascii=False, allow_nan=False)
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            continue
    return json.dumps(text, ensure_ascii=False)
