"""ERNIE's "ernie-x1" reasoning parser (whole text and streamed at every cut), its tool-call parser,
and `enable_thinking` through `chat_template_kwargs` in the serving layer with a scripted engine.

The texts follow ERNIE-4.5 thinking models' output format: thinking, `</think>`, then a
`<response>` block or `<tool_call>` blocks (see reasoning_ernie.py)."""

from __future__ import annotations

import asyncio
import json

import pytest
from scripted import ScriptedEngine

from fdcli_engine.entrypoints.openai.parsed_output import ParsedOutput
from fdcli_engine.entrypoints.openai.protocol import ChatCompletionRequest
from fdcli_engine.entrypoints.openai.reasoning_ernie import ErnieX1ReasoningParser
from fdcli_engine.entrypoints.openai.serving_chat import OpenAIServingChat
from fdcli_engine.entrypoints.openai.tool_parsers import get_tool_parser_cls
from fdcli_engine.errors import ConfigError

TOOL = '{"name": "get_weather", "arguments": {"location": "北京", "unit": "c"}}'
SPLITS = [
    # (text, reasoning, content)
    (
        "Let me think.\n</think>\n\n<response>\nThe answer is 42.\n</response>",
        "Let me think.",
        "The answer is 42.",
    ),
    ("<think>\nA\n\nB\n</think>\n\n<response>\nx\n\ny\n</response>\n", "A\n\nB", "x\n\ny"),
    ("still thinking, a < b", "still thinking, a < b", ""),
    ("plan\n</think>\n\n<tool_call>\n" + TOOL + "\n</tool_call>\n", "plan", ""),
    ("<response>\nno thinking\n</response>", None, "no thinking"),
    ("<tool_call>\n" + TOOL + "\n</tool_call>", None, ""),
    ("r\n</think>\n\nplain answer", "r", "plain answer"),
    ("r</think><response>cut off", "r", "cut off"),
    ("r</think><response>a</response>trailing", "r", "a"),
]


@pytest.mark.parametrize("text,reasoning,content", SPLITS)
def test_split_whole(text, reasoning, content):
    assert ErnieX1ReasoningParser().split(text) == ParsedOutput(reasoning, content)


def _stream(pieces):
    p = ErnieX1ReasoningParser()
    r, c = "", ""
    for i, piece in enumerate(pieces):
        out = p.feed(piece, final=i == len(pieces) - 1)
        dr, dc = out.reasoning, out.content
        r, c = r + dr, c + dc
    return r, c


@pytest.mark.parametrize("text,reasoning,content", SPLITS)
def test_streamed_split_equals_whole_at_every_cut(text, reasoning, content):
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1, 3):
            assert _stream([text[:i], text[i:j], text[j:]]) == (reasoning or "", content), (i, j)


def test_streaming_never_leaks_a_tag():
    text = SPLITS[0][0]
    p = ErnieX1ReasoningParser()
    for k, ch in enumerate(text):  # one character per delta: the hardest case for held-back tags
        out = p.feed(ch, final=k == len(text) - 1)
        r, c = out.reasoning, out.content
        assert "<" not in r + c


def test_tool_calls_extracted():
    text = "plan\n</think>\n\n<tool_call>\n" + TOOL + "\n</tool_call>\n<tool_call>\n"
    text += '{"name": "now", "arguments": "{}"}\n</tool_call>'
    out = get_tool_parser_cls("ernie-x1")().extract(text)
    assert out.tools_called and out.content is None
    calls = [c.model_dump() for c in out.tool_calls]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "now"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"location": "北京", "unit": "c"}
    assert calls[1]["function"]["arguments"] == "{}"
    assert calls[0]["type"] == "function" and calls[0]["id"] != calls[1]["id"]


def test_tool_parser_without_calls_keeps_the_answer():
    out = get_tool_parser_cls("ernie-x1")().extract(SPLITS[0][0])
    assert not out.tools_called and out.content == "The answer is 42."
    assert get_tool_parser_cls("ernie-x1")().extract("just text").content == "just text"


def test_malformed_tool_call_is_not_half_parsed():
    text = "p</think><tool_call>\n" + TOOL + "\n</tool_call><tool_call>{not json</tool_call>"
    out = get_tool_parser_cls("ernie-x1")().extract(text)
    assert not out.tools_called and out.tool_calls == [] and out.content == text


def test_unknown_tool_parser_is_a_config_error():
    with pytest.raises(ConfigError, match="ernie-x1"):
        get_tool_parser_cls("nope")


# An ERNIE-style thinking template (written for this test, same switch as the real one): with
# enable_thinking false the prompt closes an empty thinking block, so the model answers directly.
ERNIE_TEMPLATE = (
    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}Assistant: "
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}"
)


@pytest.mark.parametrize(
    "thinking,pieces,reasoning,content",
    [
        (True, ["Think", "ing.\n</thi", "nk>\n\n<resp", "onse>\nHi!\n</response>"], "Thinking.", "Hi!"),
        (False, ["<resp", "onse>\nHi!", "\n</response>"], None, "Hi!"),
    ],
)
def test_enable_thinking_through_chat_template_kwargs(tokenizer, thinking, pieces, reasoning, content):
    engine = ScriptedEngine(tokenizer, pieces)
    chat = OpenAIServingChat(
        engine, ["fake"], reasoning_parser_cls=ErnieX1ReasoningParser, chat_template=ERNIE_TEMPLATE
    )
    req = ChatCompletionRequest(
        messages=[{"role": "user", "content": "hi"}], chat_template_kwargs={"enable_thinking": thinking}
    )
    prompt = chat.render(req)[0]
    assert prompt.endswith("<think>\n\n</think>\n\n" if not thinking else "Assistant: <think>\n")
    msg = asyncio.run(chat.create_chat_completion(req)).choices[0].message
    assert (msg.reasoning_content, msg.content) == (reasoning, content)


def test_reasoning_parser_flag_selects_ernie_x1():
    from fdcli_engine.entrypoints.openai.reasoning import get_parser_cls

    assert get_parser_cls("ernie-x1") is ErnieX1ReasoningParser


def test_streamed_chat_splits_reasoning_without_tags(tokenizer):
    pieces = ["Think", "ing.\n</thi", "nk>\n\n<resp", "onse>\nHi", " there!\n</resp", "onse>"]
    chat = OpenAIServingChat(
        ScriptedEngine(tokenizer, pieces), ["fake"], reasoning_parser_cls=ErnieX1ReasoningParser
    )
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], stream=True)

    async def collect():
        return [chunk async for chunk in await chat.create_chat_completion(req)]

    chunks = asyncio.run(collect())
    deltas = [json.loads(c[6:])["choices"][0]["delta"] for c in chunks[:-1]]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == "Thinking."
    assert "".join(d.get("content") or "" for d in deltas) == "Hi there!"
    assert all("<" not in (d.get("content") or "") + (d.get("reasoning_content") or "") for d in deltas)


@pytest.mark.parametrize(
    ("text", "reasoning", "content"),
    [
        ("abc</think>xyz", "abc", "xyz"),  # FastDeploy's ErnieVLReasoningParser docstring example
        ("<think>look</think>\n\nA cat.", "look", "A cat."),
    ],
)
def test_fastdeploy_ernie_45_vl_reasoning_parser(text, reasoning, content):
    # FastDeploy's ERNIE-4.5-VL launch lines name --reasoning-parser ernie-45-vl.
    from fdcli_engine.entrypoints.openai.reasoning import get_parser_cls

    parser = get_parser_cls("ernie-45-vl")
    assert parser().split(text) == ParsedOutput(reasoning, content)
    streamed = parser()
    parts = [streamed.feed(ch) for ch in text] + [streamed.feed("", final=True)]
    assert "".join(p.reasoning or "" for p in parts) == reasoning
    assert "".join(p.content or "" for p in parts) == content
