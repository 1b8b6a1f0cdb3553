"""The tool-call parsers (hermes, llama3_json, mistral, pythonic) on outputs written the way each
model family writes them, well-formed and malformed: exact names and arguments (compared as JSON
objects, and as the exact source text where the format is JSON), the content left around the calls,
and malformed outputs returned whole as content without an exception."""

from __future__ import annotations

import json
import re

import pytest

from fdcli_engine.entrypoints.openai.tool_parsers import (
    HermesToolParser,
    Llama3JsonToolParser,
    MistralToolParser,
    PythonicToolParser,
    get_tool_parser_cls,
)

W = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
PARIS = {"city": "Paris", "unit": "celsius"}

# (parser, output, content, [(name, arguments as a JSON object)])
CASES = [
    # Qwen2.5 / Qwen3 / SmolLM2: one block, several blocks, text before, an unclosed last block
    (HermesToolParser, f"<tool_call>\n{W}\n</tool_call>", None, [("get_weather", PARIS)]),
    (
        HermesToolParser,
        f'I will check both.\n<tool_call>\n{W}\n</tool_call>\n<tool_call>\n{{"name": "now", "arguments": {{}}}}\n</tool_call>',
        "I will check both.",
        [("get_weather", PARIS), ("now", {})],
    ),
    (HermesToolParser, f"<tool_call>\n{W}\n", None, [("get_weather", PARIS)]),
    (
        HermesToolParser,
        '<tool_call>\n{"name": "search", "arguments": "{\\"q\\": \\"fd \\\\u00e9\\"}"}\n</tool_call>',
        None,
        [("search", {"q": "fd é"})],
    ),  # arguments as JSON text inside a string
    (
        HermesToolParser,
        '<tool_call>\n{"name": "deep", "arguments": {"a": {"b": [1, {"c": "}]{\\""}]}}}\n</tool_call>',
        None,
        [("deep", {"a": {"b": [1, {"c": '}]{"'}]}})],
    ),  # braces and quotes inside strings
    (HermesToolParser, "The answer is 4.", "The answer is 4.", []),
    # Llama 3.x
    (
        Llama3JsonToolParser,
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}',
        None,
        [("get_weather", PARIS)],
    ),
    (
        Llama3JsonToolParser,
        '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}; {"name": "now", "parameters": {}}',
        None,
        [("get_weather", PARIS), ("now", {})],
    ),
    (Llama3JsonToolParser, ' {"name": "now", "arguments": {}}', None, [("now", {})]),
    (Llama3JsonToolParser, "It is sunny in Paris.", "It is sunny in Paris.", []),
    # Mistral: the array form (v0.3) and the v11+ forms
    (MistralToolParser, f"[TOOL_CALLS] [{W}]", None, [("get_weather", PARIS)]),
    (
        MistralToolParser,
        f'Checking.[TOOL_CALLS][{W}, {{"name": "now", "arguments": {{}}}}]',
        "Checking.",
        [("get_weather", PARIS), ("now", {})],
    ),
    (
        MistralToolParser,
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "celsius"}[TOOL_CALLS]now[ARGS]{}',
        None,
        [("get_weather", PARIS), ("now", {})],
    ),
    (
        MistralToolParser,
        '[TOOL_CALLS]get_weather{"city": "Paris", "unit": "celsius"}',
        None,
        [("get_weather", PARIS)],
    ),
    (
        MistralToolParser,
        '[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris", "unit": "celsius"}',
        None,
        [("get_weather", PARIS)],
    ),
    # pythonic (Llama 3.2 / Llama 4, ToolACE)
    (
        PythonicToolParser,
        '[get_weather(city="Paris", unit="celsius"), now()]',
        None,
        [("get_weather", PARIS), ("now", {})],
    ),
    (
        PythonicToolParser,
        '<|python_start|>[search(q="fd", limit=3, tags=["a", "b"], opts={"x": None, "y": True}, r=(1, 2.5))]<|python_end|>',
        None,
        [
            (
                "search",
                {"q": "fd", "limit": 3, "tags": ["a", "b"], "opts": {"x": None, "y": True}, "r": [1, 2.5]},
            )
        ],
    ),
]

MALFORMED = [
    (HermesToolParser, "<tool_call>\n{bad json\n</tool_call>"),
    (HermesToolParser, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'),  # cut off
    (HermesToolParser, '<tool_call>{"arguments": {}}</tool_call>'),  # no name
    (HermesToolParser, '<tool_call>{"name": "f", "arguments": [1]}</tool_call>'),  # arguments not an object
    (HermesToolParser, f"<tool_call>{W}</tool_call><tool_call>[1, 2]</tool_call>"),  # one bad block: none
    (HermesToolParser, "<tool_call>" + "[" * 100_000 + "</tool_call>"),  # deeper than the decoder goes
    (Llama3JsonToolParser, '{"name": "get_weather", "parameters": {"city": "Paris"}} and then some'),
    (Llama3JsonToolParser, '{"name": "get_weather", "parameters": '),
    (Llama3JsonToolParser, '{"not": "a call"}'),
    (MistralToolParser, "[TOOL_CALLS] [{"),
    (MistralToolParser, '[TOOL_CALLS] [{"name": "f", "arguments": 3}]'),
    (MistralToolParser, "[TOOL_CALLS]get_weather[ARGS]{not json}"),
    (MistralToolParser, "[TOOL_CALLS]"),
    (PythonicToolParser, "[get_weather(city=open('/etc/passwd').read())]"),  # not a literal: never evaluated
    (PythonicToolParser, "[__import__('os').system('true')]"),
    (PythonicToolParser, '[get_weather("Paris")]'),  # positional arguments
    (PythonicToolParser, "[f(x={1, 2})]"),  # a set: no JSON for it
    (PythonicToolParser, "[f(x=float('inf'))]"),
    (PythonicToolParser, "[f(x=" + "[" * 5000 + "]" * 5000 + ")]"),  # nested past the bound
    (PythonicToolParser, "[get_weather(city='Paris')"),  # cut off
    (PythonicToolParser, "[1, 2, 3]"),
]


def _calls(out):
    return [(c.function.name, json.loads(c.function.arguments)) for c in out.tool_calls]


@pytest.mark.parametrize("cls,text,content,calls", CASES)
def test_recorded_outputs(cls, text, content, calls):
    out = cls().extract(text)
    assert (out.content, _calls(out)) == (content, calls)
    for call in out.tool_calls:
        assert call.type == "function"
        if cls is MistralToolParser:
            assert re.fullmatch(r"[A-Za-z0-9]{9}", call.id), call.id
        else:
            assert re.fullmatch(r"call_[0-9a-f]{24}", call.id), call.id
    assert len({c.id for c in out.tool_calls}) == len(out.tool_calls)


def test_json_formats_keep_the_arguments_source_text():
    # What the model wrote, not a re-serialization: the stream sends this text as it grows.
    text = '<tool_call>\n{"name": "f", "arguments": {"b":2,  "a": [1,2]}}\n</tool_call>'
    assert HermesToolParser().extract(text).tool_calls[0].function.arguments == '{"b":2,  "a": [1,2]}'


@pytest.mark.parametrize("cls,text", MALFORMED)
def test_malformed_outputs_stay_content(cls, text):
    out = cls().extract(text)
    assert (out.content, out.tool_calls) == (text, [])


@pytest.mark.parametrize("name", ["hermes", "llama3_json", "llama3-json", "mistral", "pythonic", "ernie-x1"])
def test_parsers_by_their_cli_names(name):
    assert get_tool_parser_cls(name) is not None
