"""vLLM's kimi_k2 tool parser on the outputs of vLLM's tests (tests/tool_parsers/
test_kimi_k2_tool_parser.py), whole and streamed: the model's own call ids, names, arguments as
written, content, and the streamed fragments adding up to the non-streamed arguments exactly."""

from __future__ import annotations

import pytest
from parser_streams import cuts, streamed

from fdcli_engine.entrypoints.openai.protocol import ChatTool
from fdcli_engine.entrypoints.openai.serving_tools import OutputSplitter
from fdcli_engine.entrypoints.openai.tool_parsers import KimiK2ToolParser, get_tool_parser_cls

SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
TOOL_BEGIN, TOOL_END, ARG_BEGIN = "<|tool_call_begin|>", "<|tool_call_end|>", "<|tool_call_argument_begin|>"


def _tool(tool_id, args):
    return f"{TOOL_BEGIN}{tool_id} {ARG_BEGIN}{args}{TOOL_END}"


def _wrap(*calls):
    return SECTION_BEGIN + "".join(calls) + SECTION_END


def tools(**props):
    return [
        ChatTool(type="function", function={"name": n, "parameters": {"type": "object", "properties": p}})
        for n, p in props.items()
    ]


WEATHER = {"city": {"type": "string"}, "unit": {"type": "string"}}
READ_FILE = {"path": {"type": "string"}}
BOOK_FLIGHT = {"city": {"type": "string"}}

# (output, content, [(id, name, arguments as written)])
CASES = [
    ("This is a test", "This is a test", []),
    (
        "I'll check. " + _wrap(_tool("functions.get_weather:0", '{"city": "Beijing"}')),
        "I'll check.",
        [("functions.get_weather:0", "get_weather", '{"city": "Beijing"}')],
    ),
    (
        "Compare weather. "
        + _wrap(
            _tool("functions.get_weather:0", '{"city": "Beijing"}'),
            _tool("functions.get_weather:1", '{"city": "Shanghai"}'),
        ),
        "Compare weather.",
        [
            ("functions.get_weather:0", "get_weather", '{"city": "Beijing"}'),
            ("functions.get_weather:1", "get_weather", '{"city": "Shanghai"}'),
        ],
    ),
    (
        "Multiple tasks. "
        + _wrap(
            _tool("functions.get_weather:0", '{"city": "New York"}'),
            _tool("functions.get_news:1", '{"topic": "technology"}'),
            _tool("functions.send_email:2", '{"to": "user@example.com", "subject": "Daily Update"}'),
        ),
        "Multiple tasks.",
        [
            ("functions.get_weather:0", "get_weather", '{"city": "New York"}'),
            ("functions.get_news:1", "get_news", '{"topic": "technology"}'),
            ("functions.send_email:2", "send_email", '{"to": "user@example.com", "subject": "Daily Update"}'),
        ],
    ),
    (
        "Process HTML. " + _wrap(_tool("functions.process_html:0", '{"html": "<div>content</div>"}')),
        "Process HTML.",
        [("functions.process_html:0", "process_html", '{"html": "<div>content</div>"}')],
    ),
    (
        "Formatted. " + _wrap(_tool("functions.process_data:0", '{\n  "name": "test",\n  "value": 123\n}')),
        "Formatted.",
        [("functions.process_data:0", "process_data", '{\n  "name": "test",\n  "value": 123\n}')],
    ),
    (
        "No prefix. " + _wrap(_tool("get_weather:0", '{"city": "Tokyo"}')),
        "No prefix.",
        [("get_weather:0", "get_weather", '{"city": "Tokyo"}')],
    ),
    (
        "Empty args. " + _wrap(_tool("functions.test:0", "{}")),
        "Empty args.",
        [("functions.test:0", "test", "{}")],
    ),
    # test_invalid_json_still_extracted: arguments are passed on as written
    (
        "Help. "
        + _wrap(
            _tool("functions.bad:0", '{"city": "Beijing"'), _tool("functions.good:1", '{"city": "Shanghai"}')
        ),
        "Help.",
        [
            ("functions.bad:0", "bad", '{"city": "Beijing"'),
            ("functions.good:1", "good", '{"city": "Shanghai"}'),
        ],
    ),
    # test_invalid_funcall_id_skipped
    (
        "Help. "
        + _wrap(
            _tool("functions.invalid.0", '{"city": "Beijing"}'),
            _tool("functions.valid:1", '{"city": "Shanghai"}'),
        ),
        "Help.",
        [("functions.valid:1", "valid", '{"city": "Shanghai"}')],
    ),
]


def _check(parser, text, content, calls, step=3):
    def ids_names_args(out):
        return [(c.id, c.function.name, c.function.arguments) for c in out.tool_calls]

    out = OutputSplitter(None, parser).split(text)
    assert (out.content, ids_names_args(out)) == (content, calls)
    got = [(n, a) for _, n, a in calls]
    for pieces in cuts(text, step):
        _, c, sent = streamed(parser, pieces)
        assert (c or None, sent) == (content, got), pieces


@pytest.mark.parametrize("text,content,calls", CASES)
def test_vllms_outputs_whole_and_streamed(text, content, calls):
    _check(get_tool_parser_cls("kimi_k2")(), text, content, calls)


def test_streamed_ids_are_the_models_own():
    text = "Compare. " + _wrap(
        _tool("functions.get_weather:0", '{"city": "Tokyo"}'), _tool("functions.get_weather:1", "{}")
    )
    splitter = OutputSplitter(None, KimiK2ToolParser())
    deltas = [d for ch in text for d in splitter.feed(ch).call_deltas] + splitter.feed(
        "", final=True
    ).call_deltas
    assert [d.id for d in deltas if d.id] == ["functions.get_weather:0", "functions.get_weather:1"]
    # Arguments go out as they are generated, not only when the call closes.
    assert len([d for d in deltas if d.index == 0 and d.function.get("arguments")]) > 5


@pytest.mark.parametrize(
    "schemas,args,name",
    [
        (
            {"get_weather": WEATHER},
            '{"city": "Tokyo", "unit": "celsius"}',
            "get_weather",
        ),  # test_bare_counter
        ({"get_weather": WEATHER}, '{"city": "Tokyo"', "get_weather"),  # the only tool, malformed JSON
        (
            {"read_file": READ_FILE, "get_weather": WEATHER},
            '{"city": "Tokyo", "unit": "celsius"}',
            "get_weather",
        ),
        ({"get_weather": WEATHER, "book_flight": BOOK_FLIGHT}, '{"city": "Tokyo"}', None),  # ambiguous
        ({"get_weather": WEATHER, "book_flight": BOOK_FLIGHT}, '{"city": "Tokyo"', None),  # malformed JSON
    ],
)
def test_a_bare_counter_id_names_the_tool_its_arguments_fit(schemas, args, name):
    text = "Let me check. " + _wrap(_tool("0", args))
    parser = KimiK2ToolParser(tools(**schemas))
    if name is None:
        _check(parser, text, text, [])
    else:
        _check(parser, text, "Let me check.", [("0", name, args)])


def test_a_call_cut_off_is_no_call():
    text = (
        "Hm. "
        + SECTION_BEGIN
        + _tool("functions.a:0", "{}")
        + TOOL_BEGIN
        + "functions.b:1 "
        + ARG_BEGIN
        + '{"x": '
    )
    out = OutputSplitter(None, KimiK2ToolParser()).split(text)
    assert [c.function.name for c in out.tool_calls] == ["a"] and out.content == "Hm."
