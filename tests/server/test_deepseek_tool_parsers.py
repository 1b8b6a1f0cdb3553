"""vLLM's deepseek_v3 and deepseek_v31 tool parsers on the outputs of vLLM's tests
(tests/tool_parsers/test_deepseekv3_tool_parser.py, test_deepseekv31_tool_parser.py), whole and
streamed: names, arguments as written, content, and the streamed fragments adding up to the
non-streamed arguments exactly."""

from __future__ import annotations

import pytest
from parser_streams import check_whole_and_streamed, cuts, streamed, whole

from fdcli_engine.entrypoints.openai.reasoning import get_parser_cls
from fdcli_engine.entrypoints.openai.serving_tools import OutputSplitter
from fdcli_engine.entrypoints.openai.tool_parsers import get_tool_parser_cls

BEGINS, ENDS = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
BEGIN, END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


def v3(name, args):
    return f"{BEGIN}function{SEP}{name}\n```json\n{args}\n```{END}"


def v31(name, args):
    return f"{BEGIN}{name}{SEP}{args}{END}"


TYPES = (
    '{"string_field": "hello", "int_field": 42, "float_field": 3.14, "bool_field": true, "null_field": null, '
    '"array_field": ["a", "b", "c"], "object_field": {"nested": "value"}, "empty_array": [], "empty_object": {}}'
)
ESCAPED = '{"text": "He said \\"hello\\"", "path": "C:\\\\Users\\\\file", "newline": "line1\\nline2"}'

# (parser, output, content, [(name, arguments as written)])
CASES = [
    (
        "deepseek_v3",
        "How can I help you today? I can check weather for you.",
        "How can I help you today? I can check weather for you.",
        [],
    ),
    (
        "deepseek_v3",
        BEGINS + v3("get_weather", '{"city": "Tokyo", "unit": "celsius"}') + ENDS,
        None,
        [("get_weather", '{"city": "Tokyo", "unit": "celsius"}')],
    ),
    (
        "deepseek_v3",
        BEGINS
        + v3("get_weather", '{"city": "Tokyo", "unit": "celsius"}')
        + v3("search_hotels", '{"location": "Tokyo", "check_in": "2025-01-15"}')
        + ENDS,
        None,
        [
            ("get_weather", '{"city": "Tokyo", "unit": "celsius"}'),
            ("search_hotels", '{"location": "Tokyo", "check_in": "2025-01-15"}'),
        ],
    ),
    ("deepseek_v3", BEGINS + v3("test_function", TYPES) + ENDS, None, [("test_function", TYPES)]),
    ("deepseek_v3", BEGINS + v3("get_current_time", "{}") + ENDS, None, [("get_current_time", "{}")]),
    (
        "deepseek_v3",
        "Let me check the weather for you." + BEGINS + v3("get_weather", '{"city": "Paris"}') + ENDS,
        "Let me check the weather for you.",
        [("get_weather", '{"city": "Paris"}')],
    ),
    ("deepseek_v3", BEGINS + v3("send_message", ESCAPED) + ENDS, None, [("send_message", ESCAPED)]),
    # Arguments on several lines (vLLM's one-line regex misses them).
    ("deepseek_v3", BEGINS + v3("f", '{\n  "a": 1\n}') + ENDS, None, [("f", '{\n  "a": 1\n}')]),
    (
        "deepseek_v31",
        "normal text" + BEGINS + v31("foo", '{"x":1}') + ENDS,
        "normal text",
        [("foo", '{"x":1}')],
    ),
    (
        "deepseek_v31",
        "some prefix text"
        + BEGINS
        + v31("foo", '{"x":1}')
        + v31("bar", '{"y":2}')
        + ENDS
        + " some suffix text",
        "some prefix text",
        [("foo", '{"x":1}'), ("bar", '{"y":2}')],
    ),
]

# vLLM's unparsable blocks: the whole answer is content.
MALFORMED = [
    ("deepseek_v3", f'{BEGINS}function{SEP}get_weather\n```json\n{{"city": "Tokyo"}}\n```{ENDS}'),
    ("deepseek_v31", "Let me look that up.<｜tool▁calls▁begin｜>get_weather"),
    ("deepseek_v31", f'{BEGINS}foo{SEP}{{"x":1}}{ENDS}'),
    ("deepseek_v3", BEGINS + f'{BEGIN}function{SEP}get_weather\n{{"city": "Tokyo"}}{END}' + ENDS),  # no fence
]


@pytest.mark.parametrize("name,text,content,calls", CASES)
def test_vllms_outputs_whole_and_streamed(name, text, content, calls):
    check_whole_and_streamed(get_tool_parser_cls(name), text, content, calls)


@pytest.mark.parametrize("name,text", MALFORMED)
def test_unparsable_blocks_leave_the_answer_as_content(name, text):
    cls = get_tool_parser_cls(name)
    assert whole(cls, text)[1:] == (text, [])
    for pieces in cuts(text, 3):
        assert streamed(cls, pieces)[1] == text, pieces


def test_arguments_stream_as_they_grow():
    text = BEGINS + v3("get_weather", '{"city": "Tokyo", "unit": "celsius"}') + ENDS
    splitter = OutputSplitter(None, get_tool_parser_cls("deepseek_v3"))
    deltas = [d for ch in text for d in splitter.feed(ch).call_deltas]
    fragments = [d.function["arguments"] for d in deltas if d.function.get("arguments")]
    assert len(fragments) > 10 and "".join(fragments) == '{"city": "Tokyo", "unit": "celsius"}'


def test_calls_after_deepseek_r1_reasoning():
    text = "Weather needs a tool.</think>" + BEGINS + v31("get_weather", '{"city": "Paris"}') + ENDS
    reasoning = get_parser_cls("deepseek_r1")
    want = ("Weather needs a tool.", None, [("get_weather", '{"city": "Paris"}')])
    assert whole(get_tool_parser_cls("deepseek_v31"), text, reasoning) == want
    for pieces in cuts(text, 4):
        r, c, sent = streamed(get_tool_parser_cls("deepseek_v31"), pieces, reasoning)
        assert (r, c or None, sent) == want, pieces
