"""Output parsers on hostile text (#28 item 6): a malformed or adversarial call is returned as plain
content, never an error, and the model's words are never dropped. How the time grows with the input is
measured by benchmarks/bench_parsers.py (linear: 10x the text, ~10x the time)."""

from __future__ import annotations

import json

import pytest

from fdcli_engine.entrypoints.batch.records import LineError, load_json_line
from fdcli_engine.entrypoints.openai.protocol import ChatMessage
from fdcli_engine.entrypoints.openai.reasoning import ThinkParser
from fdcli_engine.entrypoints.openai.reasoning_ernie import ErnieX1ReasoningParser
from fdcli_engine.entrypoints.openai.serving_chat import messages_to_dicts
from fdcli_engine.entrypoints.openai.serving_tools import OutputSplitter
from fdcli_engine.entrypoints.openai.tool_parsers import ErnieX1ToolParser

DEEP = "[" * 1000 + "]" * 1000  # deeper than Python's json decoder allows
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'

HOSTILE = {
    "unclosed-tags": "<tool_call>" * 9090,
    "unclosed-after-think": "thinking\n</think>\n\n" + "<tool_call>{" * 9090,
    "deep-json-block": f"<tool_call>{DEEP}</tool_call>",
    "deep-arguments": '<tool_call>{"name": "f", "arguments": ' + DEEP + "}</tool_call>",
    "deep-then-good": f"<tool_call>{DEEP}</tool_call>\n{CALL}",
    "close-tags-only": "</tool_call>" * 9090,
    "nested-opening": "<tool_call>" * 3 + '{"name": "f"}' + "</tool_call>",
}


def _ernie_splitter():
    return OutputSplitter(ErnieX1ReasoningParser, ErnieX1ToolParser)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_output_is_plain_content(name):
    text = HOSTILE[name]
    out = OutputSplitter(None, ErnieX1ToolParser).split(text)
    # nested-opening: the block's inside is "<tool_call><tool_call>{...}", not JSON, so no call.
    assert out.tool_calls == []
    assert out.content == text  # every character kept


def test_one_bad_block_means_no_calls():
    # A half-parsed set of calls would be worse than none: the whole text stays content.
    text = HOSTILE["deep-then-good"]
    out = ErnieX1ToolParser().extract(text)
    assert out.tool_calls == [] and out.content == text


def test_good_calls_still_parse_between_unclosed_tags():
    text = f"{CALL}\n" + "<tool_call>" * 100
    out = ErnieX1ToolParser().extract(text)
    assert [(c.function.name, json.loads(c.function.arguments)) for c in out.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]


@pytest.mark.parametrize("name", ["unclosed-after-think", "deep-arguments", "close-tags-only"])
def test_streamed_hostile_output_adds_up_to_the_whole(name):
    text = HOSTILE[name]
    whole = _ernie_splitter().split(text)
    stream = _ernie_splitter()
    pieces = [stream.feed(text[i : i + 97]) for i in range(0, len(text), 97)]
    pieces.append(stream.feed("", final=True))
    assert "".join(p.content or "" for p in pieces) == (whole.content or "")
    assert "".join(p.reasoning or "" for p in pieces) == (whole.reasoning or "")
    assert pieces[-1].tool_calls == whole.tool_calls == []


def test_think_parser_keeps_text_of_repeated_tags():
    text = "<think>" + "</think" * 5000
    parser = ThinkParser()
    got = [parser.feed(text[i : i + 13]) for i in range(0, len(text), 13)] + [parser.feed("", final=True)]
    assert "".join(p.reasoning for p in got) == ThinkParser().split(text).reasoning


def test_deep_tool_arguments_in_a_request_reach_the_template_as_text():
    deep_args = '{"a": ' * 1500 + "1" + "}" * 1500
    msg = ChatMessage.model_validate(
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": deep_args}}
            ],
        }
    )
    (d,) = messages_to_dicts([msg])
    assert d["tool_calls"][0]["function"]["arguments"] == deep_args


def test_run_batch_line_nested_too_deeply_is_a_line_error():
    raw = ('{"custom_id": "a", "body": ' + DEEP + "}").encode()
    with pytest.raises(LineError) as e:
        load_json_line(raw)
    assert e.value.code == "invalid_json" and "nested too deeply" in str(e.value)
