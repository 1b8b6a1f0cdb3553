"""ERNIE tool calling in the chat serving layer and the HTTP app, driven by a scripted engine (what the
model "says" is fixed, so the parse is exact): the whole/streamed split at every cut, tool_choice
checks, tool messages reaching the template, and the official `openai` SDK reading the responses.

A random-weight model never writes a tool call, so the real `fd serve` end-to-end checks (tools in the
prompt, accepted tool messages, flags) are in test_ernie_tool_serve.py."""

from __future__ import annotations

import json

import openai
import pytest
from scripted import ModelConfig, scripted_client

from fdcli_engine.entrypoints.openai.errors import APIError
from fdcli_engine.entrypoints.openai.protocol import ChatCompletionRequest
from fdcli_engine.entrypoints.openai.reasoning_ernie import ErnieX1ReasoningParser
from fdcli_engine.entrypoints.openai.serving_chat import messages_to_dicts
from fdcli_engine.entrypoints.openai.serving_tools import OutputSplitter, tool_call_parser
from fdcli_engine.entrypoints.openai.tool_parsers import ErnieX1ToolParser

WEATHER = '{"name": "get_weather", "arguments": {"location": "北京", "unit": "c"}}'
NOW = '{"name": "now", "arguments": {}}'
CALL = f"<tool_call>\n{WEATHER}\n</tool_call>"
R = ErnieX1ReasoningParser

# (reasoning parser, output text, reasoning, content, names of the calls) — worked out by hand from the
# rules in serving_tools.py.
CASES = [
    (R, f"plan\n</think>\n\n{CALL}\n", "plan", None, ["get_weather"]),
    (R, f"plan\n</think>\n\n{CALL}\n<tool_call>\n{NOW}\n</tool_call>", "plan", None, ["get_weather", "now"]),
    (R, f"<tool_call>\n{NOW}\n</tool_call>", None, None, ["now"]),  # thinking disabled
    (R, "plan\n</think>\n\n<response>\nIt is sunny.\n</response>", "plan", "It is sunny.", []),
    # malformed JSON: no calls, and the block stays content (the reasoning parser alone would drop it)
    (
        R,
        "p\n</think>\n\n<tool_call>\n{bad json\n</tool_call>",
        "p",
        "<tool_call>\n{bad json\n</tool_call>",
        [],
    ),
    # cut off inside the block (finish_reason length): no calls, the raw text stays content
    (R, 'p\n</think>\n\n<tool_call>\n{"name": "get_w', "p", '<tool_call>\n{"name": "get_w', []),
    (None, f"Let me check. {CALL}", None, "Let me check.", ["get_weather"]),
    (None, f"{CALL}\n", None, None, ["get_weather"]),
    (None, "Sure. <tool_call>{bad</tool_call> ok", None, "Sure. <tool_call>{bad</tool_call> ok", []),
    (None, "no tools here < > <tool", None, "no tools here < > <tool", []),
    (None, '<tool_call>{"name": ""}</tool_call>', None, '<tool_call>{"name": ""}</tool_call>', []),
]


@pytest.mark.parametrize("rp,text,reasoning,content,names", CASES)
def test_whole_split(rp, text, reasoning, content, names):
    out = OutputSplitter(rp, ErnieX1ToolParser).split(text)
    assert (out.reasoning, out.content, [c.function.name for c in out.tool_calls]) == (
        reasoning,
        content,
        names,
    )
    for call in out.tool_calls:
        assert call.id.startswith("call_") and call.type == "function"
        assert isinstance(json.loads(call.function.arguments), dict)
    if names[:1] == ["get_weather"]:
        assert json.loads(out.tool_calls[0].function.arguments) == {"location": "北京", "unit": "c"}


def _streamed(rp, pieces):
    splitter = OutputSplitter(rp, ErnieX1ToolParser)
    reasoning, content, calls = "", "", []
    for k, piece in enumerate(pieces):
        out = splitter.feed(piece, final=k == len(pieces) - 1)
        reasoning, content = reasoning + out.reasoning, content + out.content
        assert not out.tool_calls or k == len(pieces) - 1  # calls only when the output ends
        calls += out.tool_calls
    return reasoning, content, [(c.function.name, c.function.arguments) for c in calls]


@pytest.mark.parametrize("rp,text,reasoning,content,names", CASES)
def test_streamed_equals_whole_at_every_cut(rp, text, reasoning, content, names):
    whole = OutputSplitter(rp, ErnieX1ToolParser).split(text)
    want = (
        reasoning or "",
        content or "",
        [(c.function.name, c.function.arguments) for c in whole.tool_calls],
    )
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1, 2):
            assert _streamed(rp, [text[:i], text[i:j], text[j:]]) == want, (i, j)


def test_streamed_content_never_shows_a_call_block():
    text = f"Let me check. {CALL}"
    splitter = OutputSplitter(None, ErnieX1ToolParser)
    sent = ""
    for k, ch in enumerate(text):  # one character per delta: a tag split everywhere
        sent += splitter.feed(ch, final=k == len(text) - 1).content
        assert "<" not in sent, sent
    assert sent == "Let me check."


def test_parallel_tool_calls_false_keeps_the_first_call():
    text = f"{CALL}<tool_call>{NOW}</tool_call>"
    out = OutputSplitter(None, ErnieX1ToolParser, parallel_tool_calls=False).split(text)
    assert [c.function.name for c in out.tool_calls] == ["get_weather"]


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"location": {"type": "string"}}},
        },
    }
]
USER = [{"role": "user", "content": "Weather in Beijing?"}]


@pytest.mark.parametrize(
    "tools,choice,parser,want",
    [
        (TOOLS, None, ErnieX1ToolParser, True),
        (TOOLS, "auto", ErnieX1ToolParser, True),
        (TOOLS, "none", ErnieX1ToolParser, False),
        (TOOLS, "none", None, False),
        (None, None, None, False),
        (None, "none", ErnieX1ToolParser, False),
        (TOOLS, None, None, ("tools", "--tool-call-parser")),
        (TOOLS, "auto", None, ("tool_choice", "--tool-call-parser")),
        (TOOLS, {"type": "function", "function": {"name": "nope"}}, None, ("tool_choice", "'nope'")),
        (TOOLS, "sometimes", ErnieX1ToolParser, ("tool_choice", "'sometimes' is not valid")),
        (None, "auto", ErnieX1ToolParser, ("tool_choice", "tool_choice needs tools")),
    ],
)
def test_tool_choice(tools, choice, parser, want):
    req = ChatCompletionRequest(messages=USER, tools=tools, tool_choice=choice)
    if isinstance(want, bool):
        assert isinstance(tool_call_parser(req, parser), ErnieX1ToolParser) is want
        return
    with pytest.raises(APIError) as e:
        tool_call_parser(req, parser)
    assert (e.value.status, e.value.param) == (400, want[0]) and want[1] in e.value.message


HISTORY = [
    *USER,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"location": "Beijing"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 25C"},
]


def test_tool_messages_become_template_dicts():
    msgs = messages_to_dicts(ChatCompletionRequest(messages=HISTORY).messages)
    assert msgs[1]["tool_calls"] == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": {"location": "Beijing"}},
        }
    ]
    assert msgs[1]["content"] == "" and msgs[2] == {
        "role": "tool",
        "content": "sunny, 25C",
        "tool_call_id": "call_1",
    }
    # arguments that are not a JSON object reach the template as the string they are
    odd = [
        {
            **HISTORY[1],
            "tool_calls": [{**HISTORY[1]["tool_calls"][0], "function": {"name": "f", "arguments": "x"}}],
        }
    ]
    assert messages_to_dicts(ChatCompletionRequest(messages=odd).messages)[0]["tool_calls"][0][
        "function"
    ] == {
        "name": "f",
        "arguments": "x",
    }


def test_tool_calls_on_a_user_message_is_a_400():
    bad = [{"role": "user", "content": "hi", "tool_calls": HISTORY[1]["tool_calls"]}]
    with pytest.raises(APIError) as e:
        messages_to_dicts(ChatCompletionRequest(messages=bad).messages)
    assert e.value.param == "messages[0].tool_calls"


# ---------------- the HTTP app with the official openai SDK ----------------

# An ERNIE-style template written for these tests: it lists the tools, renders an assistant's calls
# as ERNIE's <tool_call> blocks and tool results, and opens the thinking block.
TEMPLATE = (
    "{% if tools %}<tools>{% for t in tools %}{{ t.function.name }}={{ t.function.parameters | tojson }};"
    "{% endfor %}</tools>{% endif %}"
    "{% for m in messages %}[{{ m.role }}]"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function.name }}"
    "{{ c.function.arguments | tojson }}</tool_call>{% endfor %}"
    "{% elif m.role == 'tool' %}<tool_response {{ m.tool_call_id }}>{{ m.content }}</tool_response>"
    "{% else %}{{ m.content }}{% endif %}{% endfor %}[assistant]<think>"
)


def _pieces(text, size=3):
    return [text[i : i + size] for i in range(0, len(text), size)]


CALLING = _pieces(f"Weather needs a lookup.\n</think>\n\n{CALL}\n")
ANSWER = _pieces("easy\n</think>\n\n<response>\nIt is sunny.\n</response>")


def _client(tokenizer, replies, **server):
    """(openai client, engine): child k of a request says replies[k]."""
    model = ModelConfig("ernie", max_model_len=4096)
    client, _, engine = scripted_client(
        tokenizer, replies=replies, model_config=model, chat_template=TEMPLATE, **server
    )
    return client, engine


ERNIE_SERVER = dict(reasoning_parser="ernie-x1", tool_call_parser="ernie-x1")


def _stream(client, **kw):
    """The streamed chunks folded into per-choice text and tool calls, with the order they came in."""
    got: dict[int, dict] = {}
    for chunk in client.chat.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            g = got.setdefault(ch.index, {"content": "", "reasoning": "", "calls": {}, "events": []})
            g["content"] += ch.delta.content or ""
            g["reasoning"] += getattr(ch.delta, "reasoning_content", None) or ""
            for tc in ch.delta.tool_calls or []:
                assert tc.index is not None
                g["calls"][tc.index] = (tc.id, tc.function.name, tc.function.arguments)
                g["events"].append("calls")
            if ch.finish_reason:
                g["events"].append(ch.finish_reason)
    return got


def test_sdk_reads_tool_calls_non_streamed_and_streamed_alike(tokenizer):
    client, _ = _client(tokenizer, [CALLING], **ERNIE_SERVER)
    resp = client.chat.completions.create(model="ernie", messages=USER, tools=TOOLS)
    choice = resp.choices[0]
    call = choice.message.tool_calls[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.model_extra["reasoning_content"] == "Weather needs a lookup."
    assert (call.type, call.function.name) == ("function", "get_weather") and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"location": "北京", "unit": "c"}

    got = _stream(client, model="ernie", messages=USER, tools=TOOLS)[0]
    assert got["events"] == ["calls", "tool_calls"]  # the calls come before the finishing chunk
    assert (got["content"], got["reasoning"]) == ("", "Weather needs a lookup.")
    ((sid, name, args),) = got["calls"].values()
    assert (name, args) == (call.function.name, call.function.arguments) and sid.startswith("call_")


def test_each_choice_is_parsed_on_its_own(tokenizer):
    client, _ = _client(tokenizer, [CALLING, ANSWER], **ERNIE_SERVER)
    resp = client.chat.completions.create(model="ernie", messages=USER, tools=TOOLS, n=2)
    first, second = sorted(resp.choices, key=lambda c: c.index)
    assert first.finish_reason == "tool_calls" and first.message.tool_calls[0].function.name == "get_weather"
    assert second.finish_reason == "stop" and second.message.tool_calls is None
    assert second.message.content == "It is sunny."
    streamed = _stream(client, model="ernie", messages=USER, tools=TOOLS, n=2)
    assert streamed[0]["events"] == ["calls", "tool_calls"] and streamed[1]["events"] == ["stop"]
    assert streamed[1]["content"] == "It is sunny." and not streamed[1]["calls"]


def test_malformed_call_is_content_streamed_or_not(tokenizer):
    bad = "p\n</think>\n\n<tool_call>\n{bad json\n</tool_call>"
    client, _ = _client(tokenizer, [_pieces(bad)], **ERNIE_SERVER)
    choice = client.chat.completions.create(model="ernie", messages=USER, tools=TOOLS).choices[0]
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None
    assert choice.message.content == "<tool_call>\n{bad json\n</tool_call>"
    got = _stream(client, model="ernie", messages=USER, tools=TOOLS)[0]
    assert (got["content"], got["calls"], got["events"]) == (choice.message.content, {}, ["stop"])


def test_tool_choice_none_renders_tools_but_does_not_parse(tokenizer):
    client, engine = _client(tokenizer, [CALLING], **ERNIE_SERVER)
    choice = client.chat.completions.create(
        model="ernie", messages=USER, tools=TOOLS, tool_choice="none"
    ).choices[0]
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None
    assert choice.message.content == ""  # the reasoning parser's content: a call block is not content
    assert "<tools>get_weather=" in engine.calls[0].prompt


def test_tools_and_tool_messages_reach_the_template(tokenizer):
    client, engine = _client(tokenizer, [ANSWER], **ERNIE_SERVER)
    first = client.chat.completions.create(model="ernie", messages=USER, tools=TOOLS)
    assert first.choices[0].message.content == "It is sunny."
    schema = json.dumps(TOOLS[0]["function"]["parameters"])
    assert (
        engine.calls[0].prompt
        == f"<tools>get_weather={schema};</tools>[user]Weather in Beijing?[assistant]<think>"
    )
    client.chat.completions.create(model="ernie", messages=HISTORY, tools=TOOLS)
    assert engine.calls[1].prompt.endswith(
        '[assistant]<tool_call>get_weather{"location": "Beijing"}</tool_call>'
        "[tool]<tool_response call_1>sunny, 25C</tool_response>[assistant]<think>"
    )


def test_sdk_message_sent_back_with_the_tool_result(tokenizer):
    """The usual agent loop: the response's assistant message goes back as is, then the tool result."""
    client, engine = _client(tokenizer, [CALLING], **ERNIE_SERVER)
    message = client.chat.completions.create(model="ernie", messages=USER, tools=TOOLS).choices[0].message
    call = message.tool_calls[0]
    follow_up = [*USER, message, {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    client.chat.completions.create(model="ernie", messages=follow_up, tools=TOOLS)
    assert (
        f'<tool_call>get_weather{{"location": "北京", "unit": "c"}}</tool_call>[tool]<tool_response {call.id}>'
        in (engine.calls[1].prompt)
    )


@pytest.mark.parametrize(
    "kw,param,words",
    [
        (dict(tools=[{"type": "retrieval", "function": {"name": "f"}}]), "tools[0].type", "function"),
        (dict(tools=[{"type": "function"}]), "tools[0].function", "required"),
        (
            dict(tools=[{"type": "function", "function": {"name": "f", "parameters": "x"}}]),
            "tools[0].function.parameters",
            "dict",
        ),
        (
            dict(tools=[{"type": "function", "function": {"description": "no name"}}]),
            "tools[0].function.name",
            "required",
        ),
        (
            dict(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"}),
            "tool_choice",
            "tool_choice and response_format",
        ),
        (
            dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}}),
            "tool_choice",
            "'get_time', which is not in tools",
        ),
        (dict(tool_choice="auto"), "tool_choice", "needs tools"),
        (dict(tools=TOOLS, chat_template_kwargs={"tools": []}), "chat_template_kwargs", "'tools'"),
    ],
)
def test_bad_tool_requests_are_400s_with_param(tokenizer, kw, param, words):
    client, _ = _client(tokenizer, [ANSWER], **ERNIE_SERVER)
    extra = {"chat_template_kwargs": kw.pop("chat_template_kwargs")} if "chat_template_kwargs" in kw else None
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="ernie", messages=USER, extra_body=extra, **kw)
    err = e.value.body
    assert err["param"] == param and words in err["message"], err


def test_tools_without_a_parser_say_which_flag(tokenizer):
    client, _ = _client(tokenizer, [ANSWER], reasoning_parser="ernie-x1")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="ernie", messages=USER, tools=TOOLS)
    assert e.value.body["param"] == "tools" and "--tool-call-parser" in e.value.body["message"]
    # tool_choice "none" needs no parser: the tools only inform the prompt
    ok = client.chat.completions.create(model="ernie", messages=USER, tools=TOOLS, tool_choice="none")
    assert ok.choices[0].message.content == "It is sunny."


def test_only_a_tool_calling_assistant_may_leave_content_out():
    calling = {k: v for k, v in HISTORY[1].items() if k != "content"}
    assert messages_to_dicts(ChatCompletionRequest(messages=[calling]).messages)[0]["content"] == ""
    with pytest.raises(APIError) as e:
        messages_to_dicts(ChatCompletionRequest(messages=[{"role": "user"}]).messages)
    assert e.value.param == "messages[0].content"
