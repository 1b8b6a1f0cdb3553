"""Tool calling through the HTTP app over a scripted engine (what the model "says" is fixed): the
official openai SDK assembles the same calls from the stream as from the whole response, for every
way the output is cut into deltas; the deltas have OpenAI's shape; ids, finish_reason and
parallel_tool_calls; tool_choice "required" / named send the engine the grammar that forces a call
(checked against jsonschema) and read its output; tools reach a template that has no `tools`
variable through the system prompt; bad tool_choice requests are 400s naming the field."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from scripted import scripted_client as _scripted_client

from fdcli_engine.entrypoints.openai.protocol import ChatCompletionRequest
from fdcli_engine.entrypoints.openai.serving_tools import tool_choice_constraint

WEATHER_PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
    "required": ["city"],
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_PARAMS}},
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}},
]
USER = [{"role": "user", "content": "Weather in Paris and the time?"}]
HERMES = (
    'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n'
    '</tool_call>\n<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'
)
LLAMA = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "now", "parameters": {}}'
MISTRAL = (
    '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "now", "arguments": {}}]'
)
PYTHONIC = '[get_weather(city="Paris"), now()]'
QWEN3_CODER = (
    "Let me look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=unit>\nc\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=now>\n"
    "</function>\n</tool_call>"
)
REQUIRED = '[{"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}}, {"name": "now", "parameters": {}}]'


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from tiny_models import write_tiny_tokenizer

    from fdcli_engine.tokenizer import Tokenizer

    return Tokenizer.from_model(write_tiny_tokenizer(tmp_path_factory.mktemp("tok")))


def scripted_client(tokenizer, pieces, **serving):
    client, http, engine = _scripted_client(tokenizer, pieces, **serving)
    engine.model_config.max_model_len = 4096  # room for the tool list in the system prompt
    return client, http, engine


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def _calls(message) -> list[tuple[str, str]]:
    return [(c.function.name, c.function.arguments) for c in message.tool_calls or []]


def _whole_and_streamed(tokenizer, text, size, parser=None, **body):
    client, _, _ = scripted_client(tokenizer, _pieces(text, size), tool_call_parser=parser)
    whole = client.chat.completions.create(model="fake", messages=USER, tools=TOOLS, **body)
    client, http, _ = scripted_client(tokenizer, _pieces(text, size), tool_call_parser=parser)
    with client.chat.completions.stream(model="fake", messages=USER, tools=TOOLS, **body) as stream:
        final = stream.get_final_completion()
    raw = http.post(
        "/v1/chat/completions",
        json={"model": "fake", "messages": USER, "tools": TOOLS, "stream": True, **body},
    )
    chunks = [json.loads(line[6:]) for line in raw.text.splitlines() if line.startswith("data: {")]
    return whole.choices[0], final.choices[0], chunks


CASES = [
    ("hermes", HERMES, {}, "Let me look."),
    ("llama3_json", LLAMA, {}, None),
    ("mistral", MISTRAL, {}, None),
    ("pythonic", PYTHONIC, {}, None),
    ("qwen3_coder", QWEN3_CODER, {}, "Let me look."),
    (None, REQUIRED, {"tool_choice": "required"}, None),
    ("hermes", REQUIRED, {"tool_choice": "required"}, None),  # read directly, not by the model's parser
]


@pytest.mark.parametrize("parser,text,body,content", CASES)
@pytest.mark.parametrize("size", [1, 2, 7, 1000])
def test_stream_helper_assembles_the_whole_responses_calls(tokenizer, parser, text, body, content, size):
    whole, streamed, chunks = _whole_and_streamed(tokenizer, text, size, parser, **body)
    assert [n for n, _ in _calls(whole.message)] == ["get_weather", "now"]
    assert _calls(streamed.message) == _calls(whole.message)
    assert (streamed.message.content or None, whole.message.content) == (content, content)
    assert whole.finish_reason == streamed.finish_reason == "tool_calls"
    ids = [c.id for c in whole.message.tool_calls]
    assert len(set(ids)) == 2 and all(i.startswith("call_") or len(i) == 9 for i in ids)
    # OpenAI's shape: per call a first part with id, type and name, then argument fragments only.
    parts = [p for c in chunks for ch in c["choices"] for p in ch["delta"].get("tool_calls", [])]
    seen = set()
    for p in parts:
        if p["index"] not in seen:
            seen.add(p["index"])
            assert set(p) == {"index", "id", "type", "function"} and p["type"] == "function", p
            assert set(p["function"]) == {"name", "arguments"}
        else:
            assert set(p) == {"index", "function"} and set(p["function"]) == {"arguments"}, p
    assert [c["choices"][0].get("finish_reason") for c in chunks if c["choices"]][-1] == "tool_calls"
    assert chunks[-1]["choices"][0]["delta"] == {}  # the finish comes after the calls, on its own


def test_qwen3_coder_values_take_the_request_tools_types(tokenizer):
    # vLLM converts each <parameter=…> value to the type the request's tool schema declares.
    days = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}
    tools = [{"type": "function", "function": {"name": "forecast", "parameters": days}}]
    text = "<tool_call>\n<function=forecast>\n<parameter=city>\n7\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
    for size in (1, 5, 1000):
        client, _, _ = scripted_client(tokenizer, _pieces(text, size), tool_call_parser="qwen3_coder")
        whole = client.chat.completions.create(model="fake", messages=USER, tools=tools)
        with client.chat.completions.stream(model="fake", messages=USER, tools=tools) as stream:
            streamed = stream.get_final_completion()
        for choice in (whole.choices[0], streamed.choices[0]):
            assert _calls(choice.message) == [("forecast", '{"city": "7", "days": 3}')]
            assert choice.finish_reason == "tool_calls"


def test_kimi_k2_calls_keep_the_models_ids(tokenizer):
    # Kimi's template writes each call's id back into the next prompt: vLLM returns the model's own.
    text = (
        "Let me look.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_call_begin|>functions.now:1'
        "<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>"
    )
    for size in (1, 4, 1000):
        whole, streamed, _ = _whole_and_streamed(tokenizer, text, size, "kimi_k2")
        for choice in (whole, streamed):
            assert _calls(choice.message) == [("get_weather", '{"city": "Paris"}'), ("now", "{}")]
            assert [c.id for c in choice.message.tool_calls] == ["functions.get_weather:0", "functions.now:1"]
            assert (choice.message.content, choice.finish_reason) == ("Let me look.", "tool_calls")


@pytest.mark.parametrize("parser,text", [("hermes", HERMES), ("mistral", MISTRAL), (None, REQUIRED)])
def test_json_arguments_are_streamed_as_they_grow(tokenizer, parser, text):
    body = {} if parser else {"tool_choice": "required"}
    _, _, chunks = _whole_and_streamed(tokenizer, text, 2, parser, **body)
    fragments = [
        p["function"]["arguments"]
        for c in chunks
        for ch in c["choices"]
        for p in ch["delta"].get("tool_calls", [])
        if p["index"] == 0 and "name" not in p["function"]
    ]
    assert len(fragments) > 5 and json.loads("".join(fragments))["city"] == "Paris"


@pytest.mark.parametrize("parser,text", [("hermes", HERMES), (None, REQUIRED)])
def test_parallel_tool_calls_false_returns_one_call(tokenizer, parser, text):
    body = (
        {"parallel_tool_calls": False}
        if parser
        else {"parallel_tool_calls": False, "tool_choice": "required"}
    )
    whole, streamed, _ = _whole_and_streamed(tokenizer, text, 3, parser, **body)
    assert [n for n, _ in _calls(whole.message)] == ["get_weather"]
    assert _calls(streamed.message) == _calls(whole.message)


def test_named_tool_choice_reads_the_arguments_object(tokenizer):
    named = {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    args = ' {"city": "Paris", "unit": "f"}'
    for size in (1, 4, 100):
        whole, streamed, _ = _whole_and_streamed(tokenizer, args, size, **named)
        assert _calls(whole.message) == [("get_weather", args.strip())] == _calls(streamed.message)
        assert whole.message.content is None and whole.finish_reason == streamed.finish_reason == "tool_calls"


@pytest.mark.parametrize(
    "body", [{"tool_choice": "required"}, {"tool_choice": {"type": "function", "function": {"name": "now"}}}]
)
def test_a_forced_choice_cut_off_is_content(tokenizer, body):
    text = '[{"name": "get_weather", "parameters": {"ci' if body["tool_choice"] == "required" else '{"x": '
    client, _, _ = scripted_client(tokenizer, _pieces(text, 3))
    choice = client.chat.completions.create(model="fake", messages=USER, tools=TOOLS, **body).choices[0]
    assert (choice.message.content, choice.message.tool_calls, choice.finish_reason) == (text, None, "stop")


def _forced_schema(tokenizer, **body):
    client, _, engine = scripted_client(tokenizer, ["[]"])
    client.chat.completions.create(model="fake", messages=USER, tools=TOOLS, **body)
    constraint = engine.calls[0][2].structured_outputs
    assert constraint.kind == "json"
    return json.loads(constraint.json)


def test_required_grammar_schema_accepts_exactly_calls_of_the_tools(tokenizer):
    schema = _forced_schema(tokenizer, tool_choice="required")
    jsonschema.Draft202012Validator.check_schema(schema)
    ok = json.loads(REQUIRED)
    jsonschema.validate(ok, schema)
    for bad in (
        [],  # at least one call
        [{"name": "get_time", "parameters": {}}],  # not a tool
        [{"name": "get_weather", "parameters": {"unit": "c"}}],  # misses the tool's required city
        [{"name": "get_weather", "parameters": {"city": "Paris", "unit": "k"}}],  # not in the enum
        [{"name": "now", "parameters": {}, "extra": 1}],
        {"name": "now", "parameters": {}},  # not an array
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    one = _forced_schema(tokenizer, tool_choice="required", parallel_tool_calls=False)
    jsonschema.validate(ok[:1], one)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(ok, one)


def test_named_grammar_schema_is_the_functions_parameters(tokenizer):
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert _forced_schema(tokenizer, tool_choice=named) == WEATHER_PARAMS


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "ping"}}])
def test_a_function_without_parameters_takes_the_empty_object(tokenizer, choice):
    """OpenAI: leaving out `parameters` defines a function with an empty parameter list; vLLM constrains
    its arguments to {}. The grammar closes the object (close_objects), so no invented keys fit."""
    from fdcli_engine.structured_output.json_schema import close_objects

    client, _, engine = scripted_client(tokenizer, ["[]"])
    ping = [{"type": "function", "function": {"name": "ping", "description": "Is it up?"}}]
    client.chat.completions.create(model="fake", messages=USER, tools=ping, tool_choice=choice)
    schema = close_objects(json.loads(engine.calls[0][2].structured_outputs.json))
    ok, invented = {}, {"helpString": "x"}
    if choice == "required":
        ok, invented = [{"name": "ping", "parameters": ok}], [{"name": "ping", "parameters": invented}]
    jsonschema.validate(ok, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(invented, schema)


def test_auto_and_none_send_no_grammar(tokenizer):
    for choice in ("auto", "none"):
        req = ChatCompletionRequest(messages=USER, tools=TOOLS, tool_choice=choice)
        assert tool_choice_constraint(req) is None


@pytest.mark.parametrize(
    "body,words",
    [
        (
            {"tool_choice": {"type": "function", "function": {"name": "get_time"}}},
            "'get_time', which is not in tools",
        ),
        ({"tool_choice": {"type": "function"}}, "a named tool_choice is"),
        (
            {"tool_choice": "required", "response_format": {"type": "json_object"}},
            "tool_choice and response_format",
        ),
        ({"tool_choice": "required", "guided_json": {"type": "object"}}, "tool_choice and guided_json"),
        (
            {
                "tool_choice": {"type": "function", "function": {"name": "now"}},
                "structured_outputs": {"regex": "a"},
            },
            "tool_choice and structured_outputs",
        ),
        ({"tool_choice": "sometimes"}, "'sometimes' is not valid"),
        ({}, "--tool-call-parser"),  # auto without a parser
    ],
)
def test_bad_tool_choice_is_a_400_naming_it(tokenizer, body, words):
    client, _, engine = scripted_client(tokenizer, ["x"])
    extra = {k: body.pop(k) for k in ("guided_json", "structured_outputs") if k in body}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="fake", messages=USER, tools=TOOLS, extra_body=extra, **body)
    err = e.value.body
    assert err["param"] in ("tool_choice", "tools") and words in err["message"], err
    assert engine.calls == []


PLAIN_CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOLS_TEMPLATE = (
    "{% if tools %}TOOLS:{{ tools | map(attribute='function.name') | join(',') }}\n{% endif %}" + PLAIN_CHATML
)


def _prompt(tokenizer, template, parser, messages=USER, **body):
    client, _, engine = scripted_client(tokenizer, ["ok"], chat_template=template, tool_call_parser=parser)
    client.chat.completions.create(model="fake", messages=messages, tools=TOOLS, **body)
    return engine.calls[0][0]


def test_a_template_without_tools_gets_them_in_the_system_prompt(tokenizer):
    prompt = _prompt(tokenizer, PLAIN_CHATML, "hermes")
    system = prompt.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\n# Tools")
    listed = system.split("<tools>\n")[1].split("\n</tools>")[0].splitlines()
    assert [json.loads(t)["function"]["name"] for t in listed] == ["get_weather", "now"]
    assert "<tool_call>" in system  # the format the hermes parser reads
    assert prompt.endswith(
        "<|im_start|>user\nWeather in Paris and the time?<|im_end|>\n<|im_start|>assistant\n"
    )
    # An existing system message keeps its text first; a forced choice does not describe a tag format.
    own = [{"role": "system", "content": "Be brief."}, *USER]
    prompt = _prompt(tokenizer, PLAIN_CHATML, None, own, tool_choice="required")
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\n# Tools") and "<tool_call>" not in prompt


def test_a_template_with_tools_renders_them_itself(tokenizer):
    prompt = _prompt(tokenizer, TOOLS_TEMPLATE, "hermes")
    assert prompt.startswith("TOOLS:get_weather,now\n<|im_start|>user") and "# Tools" not in prompt


def _split_streamed(splitter, pieces):
    reasoning, content, parts = "", "", {}
    for k, piece in enumerate(pieces):
        out = splitter.feed(piece, final=k == len(pieces) - 1)
        reasoning, content = reasoning + out.reasoning, content + out.content
        for p in out.call_deltas:
            name, args = parts.get(p.index, ("", ""))
            parts[p.index] = (name + p.function.get("name", ""), args + p.function["arguments"])
    return reasoning, content, [parts[k] for k in sorted(parts)]


QWEN3 = f"<think>\nI could write <tool_call> here.\n</think>\n\n{HERMES}"


@pytest.mark.parametrize("text", [QWEN3, HERMES, "<think>\nhm\n</think>\n\nNo tools needed."])
def test_qwen3_reasoning_and_hermes_calls_streamed_at_every_cut(text):
    from fdcli_engine.entrypoints.openai.reasoning import ThinkParser
    from fdcli_engine.entrypoints.openai.serving_tools import OutputSplitter
    from fdcli_engine.entrypoints.openai.tool_parsers import HermesToolParser

    whole = OutputSplitter(ThinkParser, HermesToolParser).split(text)
    want = (
        whole.reasoning or "",
        whole.content or "",
        [(c.function.name, c.function.arguments) for c in whole.tool_calls],
    )
    if text != HERMES:
        assert whole.reasoning.strip() in ("I could write <tool_call> here.", "hm")
    for i in range(0, len(text) + 1, 3):
        for j in range(i, len(text) + 1, 5):
            got = _split_streamed(
                OutputSplitter(ThinkParser, HermesToolParser), [text[:i], text[i:j], text[j:]]
            )
            assert got == want, (i, j)


def test_a_tool_schema_that_does_not_compile_is_a_400_naming_tools(tokenizer):
    bad = [{"type": "function", "function": {"name": "f", "parameters": {"$ref": "#/$defs/missing"}}}]
    client, _, engine = scripted_client(tokenizer, ["x"])
    for choice in ("required", {"type": "function", "function": {"name": "f"}}):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="fake", messages=USER, tools=bad, tool_choice=choice)
        assert e.value.body["param"] == "tools", e.value.body
    assert engine.calls == []


def test_a_forced_choice_starts_after_the_reasoning_block(tokenizer):
    from fdcli_engine.entrypoints.openai.serving_common import encode

    text = f"plan the calls\n</think>\n\n{REQUIRED}"
    client, _, engine = scripted_client(tokenizer, _pieces(text, 4), reasoning_parser="deepseek_r1")
    choice = client.chat.completions.create(
        model="fake", messages=USER, tools=TOOLS, tool_choice="required"
    ).choices[0]
    assert engine.calls[0][2].structured_outputs.start_after_token_ids == encode(tokenizer, "</think>", False)
    assert choice.message.model_extra["reasoning_content"] == "plan the calls\n"
    assert [c.function.name for c in choice.message.tool_calls] == ["get_weather", "now"]


def _nested_tool(name: str, city_type: str = "string") -> dict:
    """A tool whose parameters are a pydantic model holding another one: its schema keeps the inner
    model in $defs and points at it with "#/$defs/Place", as the openai SDK sends it."""
    from pydantic import BaseModel, create_model

    place = create_model("Place", city=(str if city_type == "string" else int, ...))
    model = create_model(name, place=(place, ...), days=(int, ...), __base__=BaseModel)
    return openai.pydantic_function_tool(model)


def test_required_moves_the_tools_definitions_to_the_grammars_root(tokenizer):
    """Each tool's parameters sit inside the required grammar's array; its "#/$defs/..." refs only
    resolve from the root, so the definitions are moved there (vLLM does the same)."""
    tools = [_nested_tool("Forecast"), {"type": "function", "function": {"name": "now"}}]
    client, _, engine = scripted_client(tokenizer, ["[]"])
    client.chat.completions.create(model="fake", messages=USER, tools=tools, tool_choice="required")
    schema = json.loads(engine.calls[0][2].structured_outputs.json)
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate([{"name": "Forecast", "parameters": {"place": {"city": "Paris"}, "days": 2}}], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "Forecast", "parameters": {"place": {"city": 3}, "days": 2}}], schema)
    assert tools[0]["function"]["parameters"]["$defs"]  # the request's own tools are left as sent


def test_required_refuses_two_tools_defining_one_name_differently(tokenizer):
    tools = [_nested_tool("Forecast"), _nested_tool("Alerts", city_type="integer")]
    client, _, engine = scripted_client(tokenizer, ["[]"])
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="fake", messages=USER, tools=tools, tool_choice="required")
    assert e.value.body["param"] == "tools" and "$defs/Place" in e.value.body["message"], e.value.body
    assert engine.calls == []
    same = [_nested_tool("Forecast"), _nested_tool("Alerts")]  # one definition, shared
    client.chat.completions.create(model="fake", messages=USER, tools=same, tool_choice="required")
    assert set(json.loads(engine.calls[0][2].structured_outputs.json)["$defs"]) == {"Place"}


@pytest.mark.parametrize("choice", [None, "none", "auto"])
def test_an_empty_tools_array_is_a_400_naming_tools(tokenizer, choice):
    """OpenAI's schema gives tools minItems 1 and vLLM refuses [] too: a client that meant "no tools"
    leaves the field out."""
    client, _, engine = scripted_client(tokenizer, ["x"], tool_call_parser="hermes")
    body = {} if choice is None else {"tool_choice": choice}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="fake", messages=USER, tools=[], **body)
    assert e.value.body["param"] == "tools" and "empty" in e.value.body["message"], e.value.body
    assert engine.calls == []
    client.chat.completions.create(model="fake", messages=USER)
    assert len(engine.calls) == 1


@pytest.mark.parametrize(
    "body, parser, skipped",
    [
        ({"tools": TOOLS}, "mistral", False),
        ({"tools": TOOLS}, "hermes", False),
        ({"tools": TOOLS, "tool_choice": "none"}, "mistral", True),
        ({}, "mistral", True),
        ({}, None, True),
    ],
)
def test_tools_keep_special_tokens_for_the_parser(tokenizer, body, parser, skipped):
    """As vLLM: while a tool parser reads the answer, special tokens stay in the text, because a call's
    tags are special tokens in many tokenizers (Mistral's [TOOL_CALLS]); otherwise they are skipped."""
    client, _, engine = scripted_client(tokenizer, ["hi"], tool_call_parser=parser)
    client.chat.completions.create(model="fake", messages=USER, **body)
    assert engine.calls[-1].params.skip_special_tokens is skipped


def test_a_special_tool_tag_is_only_in_the_text_kept_for_the_parser(tmp_path):
    """Why: with [TOOL_CALLS] a special token, skipping special tokens erases the tag the parser needs."""
    from tiny_models import write_tiny_tokenizer
    from tokenizers import AddedToken
    from tokenizers import Tokenizer as HfTokenizer

    folder = write_tiny_tokenizer(tmp_path)
    raw = HfTokenizer.from_file(str(folder / "tokenizer.json"))
    raw.add_tokens([AddedToken("[TOOL_CALLS]", special=True)])
    raw.save(str(folder / "tokenizer.json"))
    from fdcli_engine.tokenizer import Tokenizer

    tok = Tokenizer.from_model(folder)
    ids = tok.encode('[TOOL_CALLS][{"name": "now"}]', add_special_tokens=False)
    assert "[TOOL_CALLS]" not in tok.decode(ids, skip_special_tokens=True)
    assert tok.decode(ids, skip_special_tokens=False).startswith("[TOOL_CALLS]")
