"""vLLM's minimax_m2 tool parser on the outputs of vLLM's tests (tests/tool_parsers/
test_minimax_m2_tool_parser.py), whole and streamed: names, values typed by vLLM's minimax_m2 rules,
content, and the streamed fragments adding up to the non-streamed arguments exactly."""

from __future__ import annotations

import json

import pytest
from parser_streams import cuts, streamed, whole

from fdcli_engine.entrypoints.openai.protocol import ChatTool
from fdcli_engine.entrypoints.openai.reasoning import get_parser_cls
from fdcli_engine.entrypoints.openai.serving_tools import OutputSplitter
from fdcli_engine.entrypoints.openai.tool_parsers import MinimaxM2ToolParser, get_tool_parser_cls


def tools(**props):
    return [
        ChatTool(type="function", function={"name": n, "parameters": {"type": "object", "properties": p}})
        for n, p in props.items()
    ]


def invoke(name, **params):
    body = "".join(f'<parameter name="{k}">{v}</parameter>' for k, v in params.items())
    return f'<invoke name="{name}">{body}</invoke>'


def block(*invokes):
    return "<minimax:tool_call>" + "".join(invokes) + "</minimax:tool_call>"


# (output, content, [(name, arguments)]) with no tools: every value a string
CASES = [
    ("Hello world", "Hello world", []),
    (
        "Let me check. " + block(invoke("get_weather", city="Seattle")),
        "Let me check.",
        [("get_weather", {"city": "Seattle"})],
    ),
    (
        block(invoke("get_weather", city="Seattle", days="5")),
        None,
        [("get_weather", {"city": "Seattle", "days": "5"})],
    ),
    (
        block(invoke("search_web", query="OpenAI"), invoke("search_web", query="Gemini")),
        None,
        [("search_web", {"query": "OpenAI"}), ("search_web", {"query": "Gemini"})],
    ),
    (block(invoke("fn_a", x="1"), invoke("fn_b", y="2")), None, [("fn_a", {"x": "1"}), ("fn_b", {"y": "2"})]),
    (
        "<minimax:tool_call>\n<invoke name='now'>\n</invoke>\n</minimax:tool_call>\nDone.",
        None,
        [("now", {})],
    ),  # single quotes, no parameters, text after the block
    # Not closed (cut off): no call, the answer is content.
    ("<minimax:tool_call>" + invoke("f", a="1"), "<minimax:tool_call>" + invoke("f", a="1"), []),
]


@pytest.mark.parametrize("text,content,calls", CASES)
def test_vllms_outputs_whole_and_streamed(text, content, calls):
    cls = get_tool_parser_cls("minimax_m2")
    _, got_content, got = whole(cls, text)
    assert (got_content, [(n, json.loads(a)) for n, a in got]) == (content, calls)
    for pieces in cuts(text, 3):
        _, c, sent = streamed(cls, pieces)
        # A call cut off stays announced in a stream (docs/tool-calling.md, Streaming).
        assert (c or None, sent if calls else []) == (content, got), pieces


def test_values_take_the_schemas_types():
    # vLLM's TestAnyOfNullableParam, and its type priority (integer, number, boolean, JSON, string).
    schema = tools(
        f={
            "nickname": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "gone": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "config": {"anyOf": [{"type": "object"}, {"type": "null"}]},
            "n": {"type": "integer"},
            "x": {"type": "number"},
            "flag": {"type": "boolean"},
            "either": {"type": ["integer", "string"]},
            "level": {"enum": [1, 2, 3]},
            "word": {"type": "integer"},
            "plain": {"type": "string"},
        }
    )
    values = {
        "nickname": "Alice",
        "gone": "null",
        "config": '{"theme": "dark", "fontSize": 14}',
        "n": " 42 ",
        "x": "2.0",
        "flag": "yes",
        "either": "seven",
        "level": "2",
        "word": "many",
        "plain": "007",
        "unlisted": "[1]",
    }
    want = {
        "nickname": "Alice",
        "gone": None,
        "config": {"theme": "dark", "fontSize": 14},
        "n": 42,
        "x": 2,
        "flag": True,
        "either": "seven",
        "level": 2,
        "word": "many",
        "plain": "007",
        "unlisted": "[1]",
    }
    text = block(invoke("f", **values))
    parser = MinimaxM2ToolParser(schema)
    assert json.loads(whole(parser, text)[2][0][1]) == want
    for pieces in cuts(text, 7):
        assert streamed(parser, pieces)[2] == whole(parser, text)[2], pieces


def test_parameters_stream_one_at_a_time():
    chunks = [
        "<minimax:tool_call>",
        '<invoke name="get_weather">',
        '<parameter name="city">Seattle</parameter>',
        '<parameter name="days">5</parameter>',
        "</invoke></minimax:tool_call>",
    ]
    splitter = OutputSplitter(None, get_tool_parser_cls("minimax_m2"))
    sent = [[d.function.get("arguments") for d in splitter.feed(c).call_deltas] for c in chunks]
    assert sent[1:] == [["", "{"], ['"city": "Seattle"'], [', "days": "5"'], ["}"]]


def test_calls_after_minimax_m2_reasoning():
    text = "I need the weather.</think>\n\n" + block(invoke("get_weather", city="Paris"))
    want = ("I need the weather.", None, [("get_weather", '{"city": "Paris"}')])
    reasoning = get_parser_cls("minimax_m2")
    assert whole(get_tool_parser_cls("minimax_m2"), text, reasoning) == want
    for pieces in cuts(text, 4):
        r, c, sent = streamed(get_tool_parser_cls("minimax_m2"), pieces, reasoning)
        assert (r, c or None, sent) == want, pieces
