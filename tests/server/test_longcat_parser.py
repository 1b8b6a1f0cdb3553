"""vLLM's longcat tool parser (LongCat-Flash: hermes' JSON blocks between <longcat_tool_call> tags) on
the outputs of vLLM's tests (tests/tool_parsers/test_longcat_tool_parser.py), whole and streamed."""

from __future__ import annotations

import pytest
from parser_streams import check_whole_and_streamed, whole

from fdcli_engine.entrypoints.openai.serving_tools import tools_in_system_prompt
from fdcli_engine.entrypoints.openai.tool_parsers import (
    HermesToolParser,
    LongcatToolParser,
    get_tool_parser_cls,
)

TOKYO = '{"name": "get_weather", "arguments": {"city": "Tokyo"}}'
TYPES = """{
  "name": "test_function",
  "arguments": {
    "string_field": "hello",
    "int_field": 42,
    "null_field": null,
    "array_field": ["a", "b", "c"],
    "empty_object": {}
  }
}"""
TYPES_ARGS = '{\n    "string_field": "hello",\n    "int_field": 42,\n    "null_field": null,\n    "array_field": ["a", "b", "c"],\n    "empty_object": {}\n  }'


def tag(body):
    return f"<longcat_tool_call>{body}</longcat_tool_call>"


# (output, content, [(name, arguments as written)])
CASES = [
    (
        "This is a regular response without any tool calls.",
        "This is a regular response without any tool calls.",
        [],
    ),
    (tag(TOKYO), None, [("get_weather", '{"city": "Tokyo"}')]),
    (
        tag(TOKYO) + "\n" + tag('{"name": "get_time", "arguments": {"timezone": "Asia/Tokyo"}}'),
        None,
        [("get_weather", '{"city": "Tokyo"}'), ("get_time", '{"timezone": "Asia/Tokyo"}')],
    ),
    (tag(TYPES), None, [("test_function", TYPES_ARGS)]),
    (tag('{"name": "refresh", "arguments": {}}'), None, [("refresh", "{}")]),
    (
        "Let me check the weather for you.\n" + tag(TOKYO) + "\nHere is the result.",
        "Let me check the weather for you.",
        [("get_weather", '{"city": "Tokyo"}')],
    ),
]
MALFORMED = [
    '<longcat_tool_call>{"name": "func", "arguments": {',
    '<longcat_tool_call>{"name": "func", "arguments": "not a dict"}</longcat_tool_call>',
    "Some text with <longcat_tool_call>invalid json",
]


@pytest.mark.parametrize("text,content,calls", CASES)
def test_vllms_outputs_whole_and_streamed(text, content, calls):
    check_whole_and_streamed(get_tool_parser_cls("longcat"), text, content, calls)


@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_outputs_are_content(text):
    assert whole(get_tool_parser_cls("longcat"), text)[1:] == (text, [])


def test_hermes_tags_are_no_longcat_calls():
    text = f"<tool_call>{TOKYO}</tool_call>"
    assert whole(get_tool_parser_cls("longcat"), text)[1:] == (text, [])


def test_only_hermes_gets_its_tag_format_in_a_system_prompt():
    """A template without tools gets them in the system prompt; the <tool_call> format is described
    only to a model whose output is parsed in it."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    user = [{"role": "user", "content": "Weather?"}]
    hermes = tools_in_system_prompt(user, tools, HermesToolParser())[0]["content"]
    longcat = tools_in_system_prompt(user, tools, LongcatToolParser())[0]["content"]
    assert "<tool_call>" in hermes and "<tool_call>" not in longcat and "get_weather" in longcat
