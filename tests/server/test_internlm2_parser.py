"""vLLM's internlm tool parser on the outputs of vLLM's tests (tests/tool_parsers/
test_internlm2_tool_parser.py), whole and streamed: name, arguments as written, content, the
request's tools limiting the names, and malformed outputs left as content."""

from __future__ import annotations

import json

import pytest
from parser_streams import check_whole_and_streamed, cuts, streamed, whole

from fdcli_engine.entrypoints.openai.protocol import ChatTool
from fdcli_engine.entrypoints.openai.tool_parsers import InternLM2ToolParser, get_tool_parser_cls

WEATHER = [
    ChatTool(
        type="function",
        function={
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    )
]
TOKYO = '<|action_start|><|plugin|>{"name": "get_weather", "parameters": {"city": "Tokyo"}}<|action_end|>'
TYPES = """{
    "string_field": "hello",
    "int_field": 42,
    "array_field": ["a", "b", "c"],
    "object_field": {"nested": "value"},
    "empty_object": {}
  }"""
ESCAPED = '{\n    "quoted": "He said \\"hello\\"",\n    "path": "C:\\\\Users\\\\file.txt",\n    "unicode": "emoji: 🎉"\n  }'

# (output, content, [(name, arguments as written)])
CASES = [
    (
        "This is a regular response without any tool calls.",
        "This is a regular response without any tool calls.",
        [],
    ),
    (TOKYO, None, [("get_weather", '{"city": "Tokyo"}')]),
    (
        "Let me check the weather for you. " + TOKYO,
        "Let me check the weather for you.",
        [("get_weather", '{"city": "Tokyo"}')],
    ),
    (
        f'<|action_start|><|plugin|>{{\n  "name": "test_function",\n  "parameters": {TYPES}\n}}<|action_end|>',
        None,
        [("test_function", TYPES)],
    ),
    (
        f'<|action_start|><|plugin|>{{\n  "name": "test_function",\n  "parameters": {ESCAPED}\n}}<|action_end|>',
        None,
        [("test_function", ESCAPED)],
    ),
    (
        '<|action_start|><|plugin|>{"name": "refresh", "parameters": {}}<|action_end|>',
        None,
        [("refresh", "{}")],
    ),
    (
        '<|action_start|><|plugin|>\n{"name": "now", "arguments": {}}<|action_end|>Done.',
        None,
        [("now", "{}")],
    ),
]
MALFORMED = [
    '<|action_start|><|plugin|>{"name": "func", "parameters": {',
    '<|action_start|><|plugin|>{"name": "func", "parameters": "not a dict"}<|action_end|>',
    "<|action_start|><|plugin|>not json<|action_end|>",
    "<|action_start|><|plugin|>",
    '<|action_start|>{"name": "func"}',
]


@pytest.mark.parametrize("text,content,calls", CASES)
def test_vllms_outputs_whole_and_streamed(text, content, calls):
    check_whole_and_streamed(get_tool_parser_cls("internlm"), text, content, calls)


@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_outputs_are_content(text):
    cls = get_tool_parser_cls("internlm")
    assert whole(cls, text)[1:] == (text, [])
    for pieces in cuts(text, 3):
        assert streamed(cls, pieces)[1] == text, pieces


def test_a_name_the_request_did_not_offer_is_no_call():
    # vLLM's test_extract_unknown_tool_name_not_emitted / ..._known_... / ..._without_tools_...
    unknown = TOKYO.replace("get_weather", "delete_everything")
    assert whole(InternLM2ToolParser(WEATHER), unknown)[1:] == (unknown, [])
    assert whole(InternLM2ToolParser(WEATHER), TOKYO)[2] == [("get_weather", '{"city": "Tokyo"}')]
    assert json.loads(whole(InternLM2ToolParser(None), unknown)[2][0][1]) == {"city": "Tokyo"}
