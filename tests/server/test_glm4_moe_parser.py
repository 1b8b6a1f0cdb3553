"""vLLM's glm45 / glm47 tool parsers (GLM-4.5/4.6/4.7's <arg_key>/<arg_value> blocks) on the
outputs of vLLM's tests (tests/tool_parsers/test_glm4_moe_tool_parser.py,
test_glm47_moe_tool_parser.py), whole and streamed: names, values typed as vLLM types them, content,
and the streamed fragments adding up to the non-streamed arguments exactly."""

from __future__ import annotations

import json

import pytest
from parser_streams import cuts, streamed, whole

from fdcli_engine.entrypoints.openai.protocol import ChatTool
from fdcli_engine.entrypoints.openai.serving_tools import OutputSplitter
from fdcli_engine.entrypoints.openai.tool_parsers import Glm4MoeToolParser, get_tool_parser_cls

SAMPLE = [
    ChatTool(
        type="function",
        function={
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    )
]


def block(name, *pairs, indent="", sep="\n"):
    body = "".join(
        f"{indent}<arg_key>{k}</arg_key>{sep}{indent}<arg_value>{v}</arg_value>\n" for k, v in pairs
    )
    return f"<tool_call>{name}\n{body}{indent}</tool_call>"


DALLAS = [("city", "Dallas"), ("state", "TX"), ("unit", "fahrenheit")]

# (output, content, [(name, arguments)])
CASES = [
    ("This is a test", "This is a test", []),
    (block("get_current_weather", *DALLAS, indent="    "), None, [("get_current_weather", dict(DALLAS))]),
    (
        block("get_current_weather", *DALLAS, indent="    ")
        + "\n    "
        + block(
            "get_current_weather", ("city", "Orlando"), ("state", "FL"), ("unit", "fahrenheit"), indent="    "
        ),
        None,
        [
            ("get_current_weather", dict(DALLAS)),
            ("get_current_weather", {"city": "Orlando", "state": "FL", "unit": "fahrenheit"}),
        ],
    ),
    (
        "I'll help you check the weather. "
        + block(
            "get_current_weather", ("city", "Seattle"), ("state", "WA"), ("unit", "celsius"), indent="    "
        ),
        "I'll help you check the weather.",
        [("get_current_weather", {"city": "Seattle", "state": "WA", "unit": "celsius"})],
    ),
    (
        "I will help you get the weather."
        + block("get_weather", ("city", "Beijing"), ("date", "2025-08-01"), indent="    "),
        "I will help you get the weather.",
        [("get_weather", {"city": "Beijing", "date": "2025-08-01"})],
    ),
    ("<tool_call>get_current_time\n</tool_call>", None, [("get_current_time", {})]),
    (
        "I will help you get the weather info.\n\n"
        + block("get_weather", ("city", "Beijing"), ("date", "2025-08-01"))
        + "\n\nmeaningwhile, I will also check the weather in Shanghai.\n\n"
        + block("get_weather", ("city", "Shanghai"), ("date", "2025-08-01")),
        "I will help you get the weather info.",
        [
            ("get_weather", {"city": "Beijing", "date": "2025-08-01"}),
            ("get_weather", {"city": "Shanghai", "date": "2025-08-01"}),
        ],
    ),
    # test_extract_tool_calls_malformed_xml: what can be read is read
    (
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Seattle</arg_value>\n<arg_key>incomplete_arg\n"
        "<arg_value>value</arg_value>\n</tool_call>",
        None,
        [("get_weather", {"city": "Seattle"})],
    ),
    # test_extract_tool_calls_incomplete_tool_call: no </tool_call>, no call
    (
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n<arg_key>date</arg_key>\n"
        "<arg_value>2025-08-01</arg_value>",
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n<arg_key>date</arg_key>\n"
        "<arg_value>2025-08-01</arg_value>",
        [],
    ),
    # GLM-4.7 (test_glm47_moe_tool_parser.py): <arg_key> right after the name, no arguments at all
    (
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Beijing</arg_value></tool_call>",
        None,
        [("get_weather", {"city": "Beijing"})],
    ),
    ("<tool_call>get_current_time</tool_call>", None, [("get_current_time", {})]),
    (
        "<tool_call>get_weather<arg_key>city</arg_key>\\n<arg_value>Beijing</arg_value></tool_call>",
        None,
        [("get_weather", {"city": "Beijing"})],
    ),
]


def _check(parser, text, content, calls, step=3):
    _, got_content, got = whole(parser, text)
    assert (got_content, [(n, json.loads(a)) for n, a in got]) == (content, calls)
    for pieces in cuts(text, step):
        _, c, sent = streamed(parser, pieces)
        # A call cut off (never closed) is no call, but its parts announced while it was open stay
        # sent (docs/tool-calling.md, Streaming): the text still follows as content.
        assert (c or None, sent if calls else []) == (content, got), pieces


@pytest.mark.parametrize("name", ["glm45", "glm47"])
@pytest.mark.parametrize("text,content,calls", CASES)
def test_vllms_outputs_whole_and_streamed(name, text, content, calls):
    _check(get_tool_parser_cls(name)(SAMPLE), text, content, calls)


def test_values_are_typed_as_vllm_types_them():
    # A string-typed parameter is kept exactly as written; others are JSON, else a Python literal,
    # else stripped text.
    props = {"s": {"type": "string"}, "n": {"type": "integer"}}
    tools = [
        ChatTool(
            type="function", function={"name": "f", "parameters": {"type": "object", "properties": props}}
        )
    ]
    pairs = [
        ("s", " 42 "),
        ("n", " 42 "),
        ("list", "[1, 2]"),
        ("py", "{'a': None}"),
        ("word", " hi "),
        ("nan", "NaN"),
    ]
    _, _, got = whole(Glm4MoeToolParser(tools), block("f", *pairs))
    assert json.loads(got[0][1]) == {
        "s": " 42 ",
        "n": 42,
        "list": [1, 2],
        "py": {"a": None},
        "word": "hi",
        "nan": "NaN",
    }


def test_a_string_value_streams_as_it_grows():
    # vLLM's test_streaming_incremental_string_value: the city streams before its </arg_value>.
    chunks = [
        "<tool_call>",
        "get_weather\n",
        "<arg_key>city</arg_key>",
        "<arg_value>",
        "Bei",
        "jing",
        "</arg_value>",
        "</tool_call>",
    ]
    splitter = OutputSplitter(None, Glm4MoeToolParser(SAMPLE))
    sent = [[d.function.get("arguments") for d in splitter.feed(c).call_deltas] for c in chunks]
    assert sent[3][-1].endswith('"city": "') and sent[4] == ["Bei"] and sent[5] == ["jing"]
    assert json.loads("".join(a for s in sent for a in s)) == {"city": "Beijing"}
