"""/v1/responses through the official `openai` SDK: `client.responses.create` (whole and streamed) and
`client.responses.stream`. A scripted engine (what the model "says" is fixed) pins the exact text,
event order, usage and status; the real `fd serve` on the tiny Llama must answer exactly what chat
completions answers for the same conversation (the Responses route rides the chat path)."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
from scripted import ModelConfig, scripted_client

PIECES = ["Hel", "lo", " there", "!"]
EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    *["response.output_text.delta"] * len(PIECES),
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


def _client(tokenizer, pieces=PIECES, **serving):
    client, _, engine = scripted_client(
        tokenizer, pieces, model_config=ModelConfig("tiny", vocab_size=300), **serving
    )
    return client, engine


@pytest.fixture
def scripted(tokenizer):
    return _client(tokenizer)


def test_create_returns_the_text_usage_and_prompt(scripted, tokenizer):
    client, engine = scripted
    r = client.responses.create(model="tiny", input="Say hi", instructions="Be brief.", temperature=0.5)
    assert r.output_text == "Hello there!"
    assert r.status == "completed" and r.object == "response" and r.id.startswith("resp_")
    (message,) = r.output
    assert message.type == "message" and message.role == "assistant" and message.status == "completed"
    assert [c.type for c in message.content] == ["output_text"]
    prompt, params = engine.calls[0].prompt, engine.calls[0].params
    expected = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi"}],
        add_generation_prompt=True,
    )
    assert prompt == expected and params.temperature == 0.5
    n_prompt = len(tokenizer.encode(expected, add_special_tokens=False))
    assert (r.usage.input_tokens, r.usage.output_tokens) == (n_prompt, len(PIECES))
    assert r.usage.total_tokens == n_prompt + len(PIECES)


def test_message_items_with_input_text_parts(scripted, tokenizer):
    client, engine = scripted
    items = [
        {
            "role": "user",
            "content": [{"type": "input_text", "text": "first"}, {"type": "input_text", "text": "x"}],
        },
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
        {"role": "user", "content": "second"},
    ]
    assert client.responses.create(input=items).output_text == "Hello there!"
    expected = tokenizer.apply_chat_template(
        [
            {"role": "user", "content": "first\nx"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "second"},
        ],
        add_generation_prompt=True,
    )
    assert engine.calls[0].prompt == expected


def test_max_output_tokens_cut_is_incomplete(scripted):
    client, engine = scripted
    r = client.responses.create(input="hi", max_output_tokens=2)
    assert r.output_text == "Hello" and r.status == "incomplete"
    assert r.incomplete_details.reason == "max_output_tokens" and r.usage.output_tokens == 2
    assert engine.calls[0].params.max_tokens == 2


def test_stream_cut_by_max_output_tokens_ends_with_response_incomplete(scripted):
    """OpenAI's contract: a reply cut by max_output_tokens ends with `response.incomplete` (not
    response.completed) carrying the whole Response. The SDK's stream helper passes that event on
    with its output, so reading the terminal event gives the same Response as the whole request
    (get_final_response() waits for response.completed, on OpenAI's API too)."""
    client, _ = scripted
    whole = client.responses.create(input="hi", max_output_tokens=2)
    with client.responses.stream(model="tiny", input="hi", max_output_tokens=2) as stream:
        events = list(stream)
    terminal = events[-1]
    assert terminal.type == "response.incomplete" and "response.completed" not in [e.type for e in events]
    final = terminal.response
    assert final.status == whole.status == "incomplete"
    assert final.incomplete_details.reason == "max_output_tokens"
    assert final.output_text == whole.output_text == "Hello"
    assert [(o.type, o.status) for o in final.output] == [("message", "incomplete")]
    assert final.usage.output_tokens == whole.usage.output_tokens == 2


def test_stream_events_in_order(scripted):
    client, _ = scripted
    events = list(client.responses.create(input="hi", stream=True))
    assert [e.type for e in events] == EVENTS
    assert [e.sequence_number for e in events] == list(range(len(EVENTS)))
    assert [e.delta for e in events if e.type == "response.output_text.delta"] == PIECES
    item_ids = {e.item_id for e in events if hasattr(e, "item_id")} | {
        e.item.id for e in events if hasattr(e, "item")
    }
    assert len(item_ids) == 1
    done = events[-1].response
    assert done.output_text == "Hello there!" and done.usage.output_tokens == len(PIECES)
    assert events[0].response.id == done.id and events[0].response.status == "in_progress"


def test_stream_helper_accumulates(scripted):
    client, _ = scripted
    with client.responses.stream(model="tiny", input="hi") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == "Hello there!"


THINKING = ["<think>", "let me", " see", "</think>", "\n\nHi", "!"]


def test_reasoning_item_comes_before_the_message(tokenizer):
    client, _ = _client(tokenizer, THINKING, reasoning_parser="qwen3")
    r = client.responses.create(model="tiny", input="hi")
    assert [o.type for o in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == "let me see" and r.output_text == "Hi!"
    events = list(client.responses.create(model="tiny", input="hi", stream=True))
    types = [e.type for e in events]
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == "let me see"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Hi!"
    added = [e for e in events if e.type == "response.output_item.added"]
    done = [e for e in events if e.type == "response.output_item.done"]
    assert [(e.output_index, e.item.type) for e in added] == [(0, "reasoning"), (1, "message")]
    assert [(e.output_index, e.item.type) for e in done] == [(0, "reasoning"), (1, "message")]
    assert events.index(done[0]) < events.index(added[1])  # one item at a time
    assert [e.sequence_number for e in events] == list(range(len(events))) and types[
        -1
    ] == "response.completed"
    final = events[-1].response
    assert [o.type for o in final.output] == ["reasoning", "message"] and final.output_text == "Hi!"
    with client.responses.stream(model="tiny", input="hi") as stream:
        assert stream.get_final_response().output_text == "Hi!"


def test_reasoning_only_reply_still_ends_with_a_message(tokenizer):
    client, _ = _client(tokenizer, THINKING[:3], reasoning_parser="qwen3")
    events = list(client.responses.create(model="tiny", input="hi", stream=True))
    final = events[-1].response
    assert [o.type for o in final.output] == ["reasoning", "message"] and final.output_text == ""


@pytest.mark.parametrize(
    "body, param, words",
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type", "web_search"),
        ({"tools": [{"type": "function"}]}, "tools[0].name", "name"),
        ({"previous_response_id": "resp_1"}, "previous_response_id", "stores no responses"),
        ({"background": True}, "background", "not supported"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt", "prompt templates are not supported"),
        ({"conversation": "conv_1"}, "conversation", "conversations are not supported"),
        ({"text": {"format": {"type": "grammar"}}}, "text.format", "grammar"),
        (
            {"input": [{"type": "computer_call_output", "call_id": "c", "output": "1"}]},
            "input[0].type",
            "function_call_output",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0].type",
            "'input_file' is not supported: send input_text and input_image parts",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
            "input[0].content[0]",
            "needs image_url",
        ),
        ({"max_output_tokens": 10**6}, "max_output_tokens", "max_output_tokens"),
    ],
)
def test_unsupported_is_400_saying_so(scripted, body, param, words):
    client, engine = scripted
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(**{"input": "hi", **body})
    err = e.value.body
    assert e.value.status_code == 400 and err["param"] == param and words in err["message"], err
    assert not engine.calls


# ---- the real server (tiny random Llama): the same answer as chat completions ----


def test_real_server_matches_chat_completions(server):
    client = server.client()
    conv = [{"role": "system", "content": "You answer."}, {"role": "user", "content": "the quick brown fox"}]
    chat = client.chat.completions.create(model="tiny", messages=conv, max_tokens=12, temperature=0)
    r = client.responses.create(
        model="tiny",
        instructions="You answer.",
        input="the quick brown fox",
        max_output_tokens=12,
        temperature=0,
    )
    assert r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens
    assert r.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    streamed = list(
        client.responses.create(
            model="tiny",
            instructions="You answer.",
            input="the quick brown fox",
            max_output_tokens=12,
            temperature=0,
            stream=True,
        )
    )
    text = "".join(e.delta for e in streamed if e.type == "response.output_text.delta")
    assert text == r.output_text and streamed[-1].response.output_text == text
    assert streamed[-1].type == ("response.incomplete" if r.status == "incomplete" else "response.completed")


# ---- vLLM's extra sampling fields and the request fields the Response object repeats ----


def test_vllm_sampling_extras_reach_the_engine(scripted):
    """vLLM's ResponsesRequest takes top_k, seed, stop, repetition_penalty, ignore_eos, ...; an SDK
    user sends them in extra_body and they must change the sampling, not be dropped."""
    client, engine = scripted
    extras = {"top_k": 5, "seed": 7, "stop": ["zz"], "repetition_penalty": 1.2, "ignore_eos": True}
    client.responses.create(input="hi", extra_body=extras)
    params = engine.calls[0].params
    assert (params.top_k, params.seed, params.stop) == (5, 7, ["zz"])
    assert (params.repetition_penalty, params.ignore_eos) == (1.2, True)


def test_bad_vllm_extra_is_a_400_naming_it(scripted):
    client, engine = scripted
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(input="hi", extra_body={"top_k": "many"})
    assert e.value.body["param"] == "top_k" and not engine.calls


def test_response_repeats_the_request_fields(scripted):
    """As vLLM's ResponsesResponse.from_request (and OpenAI): the request's user, reasoning,
    tool_choice, parallel_tool_calls, truncation and service_tier, and the temperature/top_p used."""
    client, engine = scripted
    r = client.responses.create(
        input="hi",
        user="u1",
        reasoning={"effort": "low"},
        tool_choice="none",
        parallel_tool_calls=False,
        truncation="disabled",
        service_tier="default",
    )
    assert r.user == "u1" and r.reasoning.effort == "low" and r.tool_choice == "none"
    assert r.parallel_tool_calls is False and r.truncation == "disabled" and r.service_tier == "default"
    assert r.background is False
    params = engine.calls[0].params
    assert (r.temperature, r.top_p) == (params.temperature, params.top_p)
    plain = client.responses.create(input="hi")
    assert plain.tool_choice == "auto" and plain.parallel_tool_calls is True and plain.user is None
    assert client.responses.create(input="hi", tool_choice="auto").tool_choice == "auto"  # no tools: fine


def test_truncation_auto_keeps_the_prompt_tail(tokenizer):
    """vLLM maps truncation="auto" to its prompt's last max_model_len - max_output_tokens tokens: a
    prompt over the context is cut instead of refused."""
    config = ModelConfig("tiny", max_model_len=64, vocab_size=300)
    client, _, engine = scripted_client(tokenizer, PIECES, model_config=config)
    long = "word " * 200
    with pytest.raises(openai.BadRequestError):
        client.responses.create(input=long, max_output_tokens=1)
    r = client.responses.create(input=long, max_output_tokens=1, truncation="auto")
    assert len(engine.calls[-1].prompt_token_ids) == 63 and r.truncation == "auto"
    client.responses.create(input=long, max_output_tokens=4, truncation="auto")
    assert len(engine.calls[-1].prompt_token_ids) == 60


# ---- an earlier response's output sent back as input (the SDK's multi-turn idiom) ----


def test_previous_output_with_reasoning_goes_back_as_input(tokenizer):
    """`input=[user, *r.output, user]` with a reasoning model: as vLLM, the reasoning item is the
    assistant turn's reasoning_content and its message item the same turn's content."""
    client, _ = _client(tokenizer, THINKING, reasoning_parser="qwen3")
    first = client.responses.create(model="tiny", input="hi")
    turns = [{"role": "user", "content": "hi"}, *[o.model_dump() for o in first.output]]
    client2, engine = _client(tokenizer, PIECES)
    client2.responses.create(model="tiny", input=[*turns, {"role": "user", "content": "and?"}])
    expected = tokenizer.apply_chat_template(
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Hi!", "reasoning_content": "let me see"},
            {"role": "user", "content": "and?"},
        ],
        add_generation_prompt=True,
    )
    assert engine.calls[0].prompt == expected
    assert client2.responses.create(model="tiny", input=turns[:1] + turns[1:2]).status == "completed"


def test_encrypted_reasoning_is_a_400(scripted):
    client, engine = scripted
    item = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "xyz"}
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(input=[{"role": "user", "content": "hi"}, item])
    assert e.value.body["param"] == "input[1].encrypted_content" and not engine.calls


def test_incomplete_assistant_message_is_continued(scripted, tokenizer):
    """vLLM's partial completion: a last assistant message with status in_progress/incomplete is
    continued (continue_final_message), not answered."""
    client, engine = scripted
    partial = {
        "type": "message",
        "role": "assistant",
        "status": "incomplete",
        "content": [{"type": "output_text", "text": "Once upon"}],
    }
    client.responses.create(input=[{"role": "user", "content": "story"}, partial])
    whole = tokenizer.apply_chat_template(
        [{"role": "user", "content": "story"}, {"role": "assistant", "content": "Once upon"}],
        add_generation_prompt=False,
    )
    expected = whole[: whole.rindex("Once upon") + len("Once upon")]  # transformers' continue_final_message
    assert engine.calls[0].prompt == expected
    done = {**partial, "status": "completed"}
    client.responses.create(input=[{"role": "user", "content": "story"}, done])
    assert engine.calls[1].prompt != expected


# gpt-oss's template reads `reasoning_effort` ("medium" when unset); Qwen3's `enable_thinking`.
EFFORT_TEMPLATE = (
    "{%- if reasoning_effort is not defined %}{%- set reasoning_effort = 'medium' %}{%- endif %}"
    "<|im_start|>system\nReasoning: {{ reasoning_effort }}<|im_end|>\n"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{%- endif %}"
    "{%- endif %}"
)


def test_reasoning_effort_reaches_the_chat_template(tokenizer):
    """vLLM's Responses path passes reasoning.effort to the template as `reasoning_effort` (and
    nothing else: no enable_thinking, unlike its chat path)."""
    client, _, engine = scripted_client(tokenizer, PIECES, chat_template=EFFORT_TEMPLATE)
    messages = [{"role": "user", "content": "hi"}]
    for effort in ("low", "none"):
        r = client.responses.create(model="fake", input="hi", reasoning={"effort": effort, "summary": "auto"})
        want = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, chat_template=EFFORT_TEMPLATE, reasoning_effort=effort
        )
        assert engine.calls[-1].prompt == want and f"Reasoning: {effort}<" in want
        assert r.reasoning.effort == effort and r.reasoning.summary == "auto"
    client.responses.create(model="fake", input="hi")
    assert "Reasoning: medium" in engine.calls[-1].prompt  # the template's own default
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="fake", input="hi", reasoning={"effort": "extreme"})
    assert e.value.body["param"] == "reasoning.effort" and len(engine.calls) == 3


# ---- function tools (vLLM's non-harmony path: the server's --tool-call-parser reads the output) ----

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather now", "parameters": WEATHER}]
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in TOOLS[0].items() if k != "type"}}]
CALLING = [
    "Let me look.",
    "\n<tool_call>\n",
    '{"name": "get_weather", ',
    '"arguments": {"city": "Paris"}}',
    "\n</tool_call>",
]


def _tool_client(tokenizer, pieces=CALLING):
    client, _, engine = scripted_client(
        tokenizer,
        pieces,
        model_config=ModelConfig("tiny", max_model_len=4096, vocab_size=300),
        tool_call_parser="hermes",
    )
    return client, engine


def test_function_call_item_and_chat_tools(tokenizer):
    client, engine = _tool_client(tokenizer)
    r = client.responses.create(model="tiny", input="Weather in Paris?", tools=TOOLS)
    assert [o.type for o in r.output] == ["message", "function_call"]
    assert r.output_text == "Let me look."
    call = r.output[1]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert call.call_id and call.id.startswith("fc_") and call.status == "completed"
    assert r.tools[0].name == "get_weather" and r.status == "completed"
    client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Weather in Paris?"}], tools=CHAT_TOOLS
    )
    assert engine.calls[0].prompt == engine.calls[1].prompt  # the chat path's rendering of the tools


def test_function_call_streamed_and_assembled(tokenizer):
    client, _ = _tool_client(tokenizer)
    with client.responses.stream(model="tiny", input="Weather in Paris?", tools=TOOLS) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert "response.function_call_arguments.delta" in types and types[-1] == "response.completed"
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert json.loads(done.arguments) == {"city": "Paris"}
    assert [o.type for o in final.output] == ["message", "function_call"]
    assert final.output[1].name == "get_weather" and final.output_text == "Let me look."
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added = [e.output_index for e in events if e.type == "response.output_item.added"]
    assert added == [0, 1]


TWO_CALLS = (
    "Checking.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n'
    '{"name": "get_weather", "arguments": {"city": "Rome", "unit": "C"}}\n</tool_call>'
)


def _chunks(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def test_function_call_arguments_stream_as_the_parser_reads_them(tokenizer):
    """OpenAI's and vLLM's sequence per call: output_item.added (name, call_id, arguments ""), the
    argument fragments as function_call_arguments.delta events, .done (arguments, name), then
    output_item.done; one item at a time. The fragments are the chat stream's own (the same parser
    reads the same text) and add up to the whole response's arguments."""
    pieces = _chunks(TWO_CALLS, 6)
    client, _ = _tool_client(tokenizer, pieces)
    whole = client.responses.create(model="tiny", input="Weather?", tools=TOOLS)
    with client.responses.stream(model="tiny", input="Weather?", tools=TOOLS) as stream:
        events = list(stream)
        final = stream.get_final_response()
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Weather?"}], tools=CHAT_TOOLS, stream=True
    )
    chat_parts: dict[int, list[str]] = {}
    chat_ids = {}
    for chunk in chat:
        for call in chunk.choices[0].delta.tool_calls or ():
            chat_ids.setdefault(call.index, call.id)
            if call.function.arguments:
                chat_parts.setdefault(call.index, []).append(call.function.arguments)
    calls = [o for o in final.output if o.type == "function_call"]
    assert (
        [o.type for o in final.output]
        == [o.type for o in whole.output]
        == ["message"] + ["function_call"] * 2
    )
    for k, call in enumerate(calls):
        own = [
            e
            for e in events
            if getattr(e, "item_id", None) == call.id or getattr(e, "item", None) and e.item.id == call.id
        ]
        assert [e.type for e in own] == [
            "response.output_item.added",
            *["response.function_call_arguments.delta"] * len(chat_parts[k]),
            "response.function_call_arguments.done",
            "response.output_item.done",
        ]
        deltas = [e.delta for e in own if e.type == "response.function_call_arguments.delta"]
        assert len(deltas) > 1 and deltas == chat_parts[k]
        assert "".join(deltas) == own[-2].arguments == call.arguments == whole.output[k + 1].arguments
        assert own[0].item.arguments == "" and own[0].item.status == "in_progress"
        assert own[0].item.name == own[-2].name == call.name == "get_weather"
        assert call.call_id == own[0].item.call_id and call.status == "completed"
        assert call.id.startswith("fc_") and own[0].output_index == k + 1
    assert [json.loads(c.arguments) for c in calls] == [{"city": "Paris"}, {"city": "Rome", "unit": "C"}]
    assert len({c.id for c in calls}) == len({c.call_id for c in calls}) == len(chat_ids) == 2
    assert final.output_text == whole.output_text == "Checking."
    added = [e for e in events if e.type == "response.output_item.added"]
    done = [e for e in events if e.type == "response.output_item.done"]
    for opened, closed in zip(added[1:], done):  # each item is closed before the next one opens
        assert events.index(closed) < events.index(opened)
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_a_call_cut_by_max_output_tokens_is_left_incomplete(tokenizer):
    """A call cut off mid-arguments is no call (the whole response has only the message, its text
    raw); streamed, its item was already open: it is closed incomplete, and the text follows as a
    message, so the answer's text is the whole response's."""
    client, _ = _tool_client(tokenizer, _chunks(TWO_CALLS, 6))
    whole = client.responses.create(model="tiny", input="Weather?", tools=TOOLS, max_output_tokens=9)
    assert [(o.type, o.status) for o in whole.output] == [("message", "incomplete")]
    events = list(
        client.responses.create(model="tiny", input="Weather?", tools=TOOLS, max_output_tokens=9, stream=True)
    )
    final = events[-1].response
    assert events[-1].type == "response.incomplete" and final.status == "incomplete"
    assert [(o.type, o.status) for o in final.output] == [
        ("message", "completed"),
        ("function_call", "incomplete"),
        ("message", "incomplete"),
    ]
    assert "".join(o.content[0].text for o in final.output if o.type == "message") == whole.output_text
    assert len({o.id for o in final.output}) == 3


def test_function_call_arguments_stream_before_the_output_ends(tokenizer):
    """The first argument fragment leaves while the model is still writing the call: the engine had
    not produced its last piece when it was sent."""
    from scripted import ScriptedEngine

    from fdcli_engine.entrypoints.openai.protocol_responses import ResponsesRequest
    from fdcli_engine.entrypoints.openai.serving_chat import OpenAIServingChat
    from fdcli_engine.entrypoints.openai.serving_responses import OpenAIServingResponses
    from fdcli_engine.entrypoints.openai.tool_parsers.hermes import HermesToolParser

    pieces = _chunks(TWO_CALLS, 6)
    engine = ScriptedEngine(tokenizer, pieces, ModelConfig("tiny", max_model_len=4096, vocab_size=300))
    serving = OpenAIServingResponses(OpenAIServingChat(engine, ["tiny"], tool_parser_cls=HermesToolParser))
    req = ResponsesRequest(input="Weather?", tools=TOOLS, stream=True)

    async def produced_at_first_delta():
        async for event in await serving.create_response(req):
            if "response.function_call_arguments.delta" in event:
                return engine.produced

    produced = asyncio.run(produced_at_first_delta())
    assert produced is not None and produced < len(pieces) - 5


def test_function_tools_type_qwen3_coder_values(tokenizer):
    # The Responses API's function tools reach the parser too: qwen3_coder types each value by the
    # tool's schema, whole and streamed.
    days = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}
    tools = [{"type": "function", "name": "forecast", "parameters": days}]
    pieces = [
        "<tool_call>\n<function=forecast>\n",
        "<parameter=city>\n7\n</parameter>\n",
        "<parameter=days>\n3\n",
        "</parameter>\n</function>\n</tool_call>",
    ]
    for stream in (False, True):
        client, _, _ = scripted_client(
            tokenizer,
            pieces,
            model_config=ModelConfig("tiny", max_model_len=4096, vocab_size=300),
            tool_call_parser="qwen3_coder",
        )
        if stream:
            with client.responses.stream(model="tiny", input="Forecast?", tools=tools) as events:
                r = events.get_final_response()
        else:
            r = client.responses.create(model="tiny", input="Forecast?", tools=tools)
        call = r.output[-1]
        assert (call.type, call.name, call.arguments) == (
            "function_call",
            "forecast",
            '{"city": "7", "days": 3}',
        )


def test_function_call_output_round_trip(tokenizer):
    """The SDK's loop: input += r.output, then a function_call_output item with the call's call_id;
    the chat template sees the assistant's tool call and the tool's answer."""
    client, _ = _tool_client(tokenizer)
    first = client.responses.create(model="tiny", input="Weather in Paris?", tools=TOOLS)
    call = first.output[1]
    follow = [
        {"role": "user", "content": "Weather in Paris?"},
        *[o.model_dump(exclude_none=True) for o in first.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": '{"temp": 21}'},
    ]
    client2, engine = _tool_client(tokenizer, ["It is 21."])
    r = client2.responses.create(model="tiny", input=follow, tools=TOOLS)
    assert r.output_text == "It is 21."
    client2.chat.completions.create(
        model="tiny",
        tools=CHAT_TOOLS,
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": "Let me look.",
                "tool_calls": [
                    {
                        "id": call.call_id,
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": call.arguments},
                    }
                ],
            },
            {"role": "tool", "content": '{"temp": 21}', "tool_call_id": call.call_id},
        ],
    )
    assert engine.calls[0].prompt == engine.calls[1].prompt
    assert '{"temp": 21}' in engine.calls[0].prompt


def test_named_tool_choice_takes_the_responses_shape(tokenizer):
    """Responses' {"type": "function", "name": ...} (flat, unlike chat's) forces that function."""
    client, _ = _tool_client(tokenizer, ['{"city": "Rome"}'])
    r = client.responses.create(
        model="tiny", input="Weather?", tools=TOOLS, tool_choice={"type": "function", "name": "get_weather"}
    )
    (call,) = r.output
    assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Rome"}
    assert r.tool_choice.name == "get_weather"


def test_real_server_output_text_logprobs_match_chat(server):
    """include=["message.output_text.logprobs"] with top_logprobs (vLLM's and OpenAI's): the
    output_text part carries the chat path's logprobs for the same conversation, whole and streamed."""
    client = server.client()
    chat = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "the fox"}],
        max_tokens=5,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    want = [c.model_dump() for c in chat.choices[0].logprobs.content]
    body = dict(model="tiny", input="the fox", max_output_tokens=5, temperature=0, top_logprobs=2)
    body["include"] = ["message.output_text.logprobs"]
    r = client.responses.create(**body)
    assert [lp.model_dump(exclude_none=True) for lp in r.output[0].content[0].logprobs] == want
    assert r.top_logprobs == 2
    events = list(client.responses.create(**body, stream=True))
    streamed = [
        lp.model_dump(exclude_none=True)
        for e in events
        if e.type == "response.output_text.delta"
        for lp in e.logprobs
    ]
    assert streamed == want
    final = events[-1].response.output[0].content[0].logprobs
    assert [lp.model_dump(exclude_none=True) for lp in final] == want
    plain = client.responses.create(model="tiny", input="the fox", max_output_tokens=2)
    assert not plain.output[0].content[0].logprobs


def test_stored_response_routes_say_fd_stores_none(scripted):
    """vLLM serves GET/DELETE /v1/responses/{id} and POST .../cancel, answering 404 for an id it did
    not store (always, without VLLM_ENABLE_RESPONSES_API_STORE); fd stores none, and says so."""
    client, _ = scripted
    calls = [
        lambda: client.responses.retrieve("resp_1"),
        lambda: client.responses.delete("resp_1"),
        lambda: client.responses.cancel("resp_1"),
        lambda: client.responses.input_items.list("resp_1"),
    ]
    for call in calls:
        with pytest.raises(openai.NotFoundError) as e:
            call()
        err = e.value.body
        assert "resp_1" in err["message"] and "stores no responses" in err["message"], err
        assert err["param"] == "response_id"
