"""vLLM's xlam tool parser on the outputs of vLLM's tests (tests/tool_parsers/
test_xlam_tool_parser.py), whole and streamed: the array found bare, after a thinking block, in a
```json fence, after [TOOL_CALLS] or in <tool_call> tags; content; and the streamed fragments adding
up to the non-streamed arguments exactly."""

from __future__ import annotations

import json

import pytest
from parser_streams import check_whole_and_streamed, cuts, streamed, whole

from fdcli_engine.entrypoints.openai.reasoning import get_parser_cls
from fdcli_engine.entrypoints.openai.tool_parsers import get_tool_parser_cls

DALLAS = {"city": "Dallas", "state": "TX", "unit": "fahrenheit"}
ORLANDO = {"city": "Orlando", "state": "FL", "unit": "fahrenheit"}
ONE = json.dumps([{"name": "get_current_weather", "arguments": DALLAS}])
TWO = json.dumps(
    [
        {"name": "get_current_weather", "arguments": DALLAS},
        {"name": "get_current_weather", "arguments": ORLANDO},
    ]
)
W = ("get_current_weather", json.dumps(DALLAS))

# (output, content, [(name, arguments)])
CASES = [
    ("This is a test", "This is a test", []),
    (TWO, None, [W, ("get_current_weather", json.dumps(ORLANDO))]),
    ("<think>I'll help you with that.</think>" + ONE, "<think>I'll help you with that.</think>", [W]),
    ("I'll help you with that.\n```json\n" + ONE + "\n```", "I'll help you with that.", [W]),
    ("```json\n" + ONE + "\n```", None, [W]),
    ("I'll check the weather for you.[TOOL_CALLS]" + ONE, "I'll check the weather for you.", [W]),
    (
        "I'll help you check the weather.<tool_call>" + ONE + "</tool_call>",
        "I'll help you check the weather.",
        [W],
    ),
    (
        '[{"name": "get_current_weather", "arguments": {"city": "Seattle"}}]',
        None,
        [("get_current_weather", '{"city": "Seattle"}')],
    ),
    ("Here:\n```\n" + ONE + "\n```", "Here:", [W]),  # a fence without a language holding an array
    # Not calls: the whole answer is content.
    ("```python\nprint([1])\n```", "```python\nprint([1])\n```", []),
    ("[1] is a citation.", "[1] is a citation.", []),
    ('```json\n{"name": "f", "arguments": {}}\n```', '```json\n{"name": "f", "arguments": {}}\n```', []),
]


@pytest.mark.parametrize("text,content,calls", CASES)
def test_vllms_outputs_whole_and_streamed(text, content, calls):
    check_whole_and_streamed(get_tool_parser_cls("xlam"), text, content, calls)


def test_calls_after_a_reasoning_parsers_block():
    text = "<think>I'll help you with that.</think>" + ONE
    want = ("I'll help you with that.", None, [W])
    reasoning = get_parser_cls("qwen3")
    assert whole(get_tool_parser_cls("xlam"), text, reasoning) == want
    for pieces in cuts(text, 5):
        r, c, sent = streamed(get_tool_parser_cls("xlam"), pieces, reasoning)
        assert (r, c or None, sent) == want, pieces
