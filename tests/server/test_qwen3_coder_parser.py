"""vLLM's qwen3_coder / qwen3_xml / seed_oss tool parsers (Qwen3-Coder's <function=…><parameter=…> XML), on the
outputs and tool schemas of vLLM's tests (tests/tool_parsers/test_qwen3coder_tool_parser.py and
test_qwen3_xml_coder_shared.py), whole and streamed: names, arguments converted to the schema's
types, content, and the streamed fragments adding up to the non-streamed arguments exactly."""

from __future__ import annotations

import json

import pytest
from parser_streams import cuts, streamed, whole

from fdcli_engine.entrypoints.openai.protocol import ChatTool
from fdcli_engine.entrypoints.openai.reasoning import get_parser_cls
from fdcli_engine.entrypoints.openai.serving_tools import OutputSplitter
from fdcli_engine.entrypoints.openai.tool_parsers import (
    Qwen3CoderToolParser,
    SeedOssToolParser,
    get_tool_parser_cls,
)


def tools(**schemas):
    return [
        ChatTool(
            type="function", function={"name": name, "parameters": {"type": "object", "properties": props}}
        )
        for name, props in schemas.items()
    ]


WEATHER = {
    "city": {"type": "string"},
    "state": {"type": "string"},
    "unit": {"type": "string", "enum": ["fahrenheit", "celsius"]},
}
AREA = {"shape": {"type": "string"}, "dimensions": {"type": "object"}, "precision": {"type": "integer"}}
SAMPLE = tools(get_current_weather=WEATHER, calculate_area=AREA)


def call(name, **params):
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


DALLAS = call("get_current_weather", city="Dallas", state="TX", unit="fahrenheit")
ORLANDO = call("get_current_weather", city="Orlando", state="FL", unit="fahrenheit")
DALLAS_ARGS = {"city": "Dallas", "state": "TX", "unit": "fahrenheit"}

# (output, content, [(name, arguments)]): vLLM's test_extract_tool_calls cases
CASES = [
    ("This is a test response without any tool calls", "This is a test response without any tool calls", []),
    (DALLAS, None, [("get_current_weather", DALLAS_ARGS)]),
    (
        "Sure! Let me check the weather for you." + DALLAS,
        "Sure! Let me check the weather for you.",
        [("get_current_weather", DALLAS_ARGS)],
    ),
    (
        call("calculate_area", shape="rectangle", dimensions='{"width": 10, \n "height": 20}', precision="2"),
        None,
        [
            (
                "calculate_area",
                {"shape": "rectangle", "dimensions": {"width": 10, "height": 20}, "precision": 2},
            )
        ],
    ),
    (
        DALLAS + "\n" + ORLANDO,
        None,
        [
            ("get_current_weather", DALLAS_ARGS),
            ("get_current_weather", {"city": "Orlando", "state": "FL", "unit": "fahrenheit"}),
        ],
    ),
    (
        "Let me calculate that area for you."
        + call("calculate_area", shape="circle", dimensions='{"radius": 15.5}', precision="3"),
        "Let me calculate that area for you.",
        [("calculate_area", {"shape": "circle", "dimensions": {"radius": 15.5}, "precision": 3})],
    ),
    # test_extract_tool_calls_fallback_no_tags: no <tool_call> wrapper
    (
        "<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n<parameter=state>\nTX\n"
        "</parameter>\n</function>",
        None,
        [("get_current_weather", {"city": "Dallas", "state": "TX"})],
    ),
    # test_extract_tool_calls_missing_closing_parameter_tag: the next parameter ends the value
    (
        "Let me check the weather for you:\n<tool_call>\n<function=get_current_weather>\n"
        "<parameter=city>\nDallas\n<parameter=state>\nTX\n</parameter>\n<parameter=unit>\nfahrenheit\n"
        "</parameter>\n</function>\n</tool_call>",
        "Let me check the weather for you:",
        [("get_current_weather", DALLAS_ARGS)],
    ),
    # test_none_tool_calls_filtered: a function name without its ">" is no call; the next one is
    (
        "<tool_call>\n<function=bad_func_no_gt\n</function>\n</tool_call>\n<tool_call>\n"
        "<function=get_current_weather>\n<parameter=city>Dallas</parameter>\n"
        "<parameter=state>TX</parameter>\n</function>\n</tool_call>",
        None,
        [("get_current_weather", {"city": "Dallas", "state": "TX"})],
    ),
    # test_extract_tool_calls_streaming_missing_opening_tag
    (
        "I'll check the weather for you.\n\n<function=get_current_weather>\n<parameter=city>\nDallas\n"
        "</parameter>\n<parameter=state>\nTX\n</parameter>\n<parameter=unit>\nfahrenheit\n</parameter>\n"
        "</function>\n</tool_call>",
        "I'll check the weather for you.",
        [("get_current_weather", DALLAS_ARGS)],
    ),
]


def _check(parser, text, content, calls, step=3):
    _, got_content, got = whole(parser, text)
    assert (got_content, [(n, json.loads(a)) for n, a in got]) == (content, calls)
    for pieces in cuts(text, step):
        _, c, sent = streamed(parser, pieces)
        assert (c or None, sent) == (content, got), pieces  # the same argument text, exactly


@pytest.mark.parametrize("name", ["qwen3_coder", "qwen3_xml"])
@pytest.mark.parametrize("text,content,calls", CASES)
def test_vllms_outputs_whole_and_streamed(name, text, content, calls):
    _check(get_tool_parser_cls(name)(SAMPLE), text, content, calls)


def test_values_take_the_types_the_schema_declares():
    # vLLM's test_extract_tool_calls_type_conversion and ..._anyof_type_conversion
    schema = tools(
        t={
            "int_param": {"type": "integer"},
            "float_param": {"type": "float"},
            "bool_param": {"type": "boolean"},
            "str_param": {"type": "string"},
            "obj_param": {"type": "object"},
            "anyof_int": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": 5},
            "anyof_str": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "anyof_array": {"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]},
            "anyof_obj": {"anyOf": [{"type": "object"}, {"type": "null"}]},
            "type_as_array": {"type": ["integer", "null"]},
            "multi_non_null": {"anyOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]},
            "repr_obj": {"type": "object"},
            "nullable_str": {"type": ["string", "null"]},
            "not_int": {"type": "integer"},
            "whole_number": {"type": "number"},
            "nan": {"type": "number"},
            "undeclared": {},
        }
    )
    values = {
        "int_param": "42",
        "float_param": "3.14",
        "bool_param": "true",
        "str_param": "hello world",
        "obj_param": '{"key": "value"}',
        "anyof_int": "5",
        "anyof_str": "hello",
        "anyof_array": '["a", "b", "c"]',
        "anyof_obj": '{"key": "value", "count": 42}',
        "type_as_array": "42",
        "multi_non_null": "some text",
        "repr_obj": "{'key': 'value'}",  # test_extract_tool_calls_complex_type_with_single_quote
        "nullable_str": "None",
        "not_int": "forty",
        "whole_number": "7.0",
        "nan": "nan",
        "undeclared_extra": "12",
    }
    want = {
        "int_param": 42,
        "float_param": 3.14,
        "bool_param": True,
        "str_param": "hello world",
        "obj_param": {"key": "value"},
        "anyof_int": 5,
        "anyof_str": "hello",
        "anyof_array": ["a", "b", "c"],
        "anyof_obj": {"key": "value", "count": 42},
        "type_as_array": 42,
        "multi_non_null": "some text",
        "repr_obj": {"key": "value"},
        "nullable_str": None,
        "not_int": "forty",
        "whole_number": 7,
        "nan": "nan",
        "undeclared_extra": "12",
    }
    text = call("t", **values)
    _, _, got = whole(Qwen3CoderToolParser(schema), text)
    args = json.loads(got[0][1])
    assert args == want and type(args["whole_number"]) is int and type(args["float_param"]) is float
    # Without the request's tools every value stays a string, as in vLLM.
    assert json.loads(whole(Qwen3CoderToolParser(), text)[2][0][1]) == values


def test_literal_xml_inside_a_value_is_part_of_it():
    code = 'print("</parameter>")\nxml = "<parameter=x>\\n1\\n</parameter>"'
    text = call("write_file", path="a.py", content=code)
    _check(Qwen3CoderToolParser(), text, None, [("write_file", {"path": "a.py", "content": code})])


def test_arguments_stream_one_parameter_at_a_time():
    # vLLM's test_streaming_multi_param_single_chunk deltas, and its streaming shape: "{" with the
    # name, each parameter once complete, "}" at </function>.
    deltas = [
        "<tool_call>",
        "\n<function=get_current_weather>",
        "\n",
        "<parameter=city>\nDallas\n</parameter>\n<parameter=state>\nTX\n</parameter>",
        "\n<parameter=unit>\nfahrenheit\n</parameter>",
        "\n</function>",
        "\n</tool_call>",
    ]
    splitter = OutputSplitter(None, Qwen3CoderToolParser(SAMPLE))
    sent = [splitter.feed(d, final=i == len(deltas) - 1).call_deltas for i, d in enumerate(deltas)]
    args = [[d.function["arguments"] for d in s if d.function["arguments"]] for s in sent]
    assert sent[1][0].function["name"] == "get_current_weather"
    assert args == [[], ["{"], [], ['"city": "Dallas"'], [', "state": "TX"'], [', "unit": "fahrenheit"}'], []]
    assert json.loads("".join(sum(args, []))) == DALLAS_ARGS


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>\n<function={{ tool.name }}>\n</function>\n</tool_call>",  # an unrendered template
        "Use <tool_call> tags to call tools.",
        "<function=>\n</function>",
    ],
)
def test_text_that_is_no_call_stays_content(text):
    _check(Qwen3CoderToolParser(SAMPLE), text, text, [])


def test_a_call_cut_off_by_max_tokens_is_read_as_far_as_it_goes():
    text = "<tool_call>\n<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n<parameter=state>\nT"
    _check(
        Qwen3CoderToolParser(SAMPLE), text, None, [("get_current_weather", {"city": "Dallas", "state": "T"})]
    )


def _seed(text):
    return text.replace("<tool_call>", "<seed:tool_call>").replace("</tool_call>", "</seed:tool_call>")


@pytest.mark.parametrize("text,content,calls", CASES)
def test_seed_oss_writes_the_same_calls_in_its_own_tags(text, content, calls):
    # vLLM's seed_oss tool parser is qwen3_coder's with <seed:tool_call> wrappers.
    text, content = _seed(text), content and _seed(content)
    _check(get_tool_parser_cls("seed_oss")(SAMPLE), text, content, calls)


def test_seed_oss_reasoning_then_calls():
    # vLLM's test_seed_oss_tool_parser.py: thinking, then a call; typed by the schema.
    text = (
        "The user wants the weather.</seed:think>Let me check.<seed:tool_call>\n<function=get_current_weather>\n"
        "<parameter=city>\nBarcelona\n</parameter>\n<parameter=state>\nCT\n</parameter>\n</function>\n</seed:tool_call>"
    )
    reasoning, parser = get_parser_cls("seed_oss"), SeedOssToolParser(SAMPLE)
    want = (
        "The user wants the weather.",
        "Let me check.",
        [("get_current_weather", '{"city": "Barcelona", "state": "CT"}')],
    )
    assert whole(parser, text, reasoning) == want
    for pieces in cuts(text, 4):
        r, c, sent = streamed(parser, pieces, reasoning)
        assert (r, c or None, sent) == want, pieces
