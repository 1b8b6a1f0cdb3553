"""Structured-output request forms and their 400s (structured_outputs.py), through the official openai
SDK against an in-process app over a scripted engine: every form reaches the engine as the expected
StructuredOutputsParams; a bad constraint is a 400 naming the request's field, in bounded time, and
the server answers the next request."""

from __future__ import annotations

import json
from types import SimpleNamespace

import openai
import pytest
from fastapi.testclient import TestClient
from scripted import ScriptedEngine, scripted_client

from fdcli_engine.entrypoints.openai.app_state import Admission, AppState, ServerArgs
from fdcli_engine.entrypoints.openai.http_app import build_app
from fdcli_engine.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from fdcli_engine.entrypoints.openai.reasoning import DeepSeekR1Parser, ThinkParser, reasoning_markers
from fdcli_engine.entrypoints.openai.serving_options import ServingOptions
from fdcli_engine.entrypoints.openai.structured_outputs import (
    MAX_CONSTRAINT_CHARS,
    constraint_of,
    to_params,
)
from fdcli_engine.structured_output import StructuredOutputsParams

MSG = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from tiny_models import write_tiny_tokenizer

    from fdcli_engine.tokenizer import Tokenizer

    return Tokenizer.from_model(write_tiny_tokenizer(tmp_path_factory.mktemp("tok")))


@pytest.fixture(scope="module")
def app(tokenizer):
    return scripted_client(tokenizer, ['{"a": 1}'])


def _chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=MSG, **fields)


FORMS = [
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": SCHEMA, "strict": True},
            }
        },
        StructuredOutputsParams(json=SCHEMA),
    ),
    ({"response_format": {"type": "json_object"}}, StructuredOutputsParams(json_object=True)),
    ({"structured_outputs": {"json": SCHEMA}}, StructuredOutputsParams(json=SCHEMA)),
    ({"structured_outputs": {"regex": "[0-9]+"}}, StructuredOutputsParams(regex="[0-9]+")),
    ({"structured_outputs": {"choice": ["yes", "no"]}}, StructuredOutputsParams(choice=["yes", "no"])),
    ({"structured_outputs": {"grammar": 'start: "a"'}}, StructuredOutputsParams(grammar='start: "a"')),
    ({"structured_outputs": {"json_object": True}}, StructuredOutputsParams(json_object=True)),
    # vLLM's options next to the constraint are accepted (documented as not honoured).
    (
        {"structured_outputs": {"regex": "a", "json_object": False, "disable_any_whitespace": True}},
        StructuredOutputsParams(regex="a"),
    ),
    ({"guided_json": SCHEMA}, StructuredOutputsParams(json=SCHEMA)),
    ({"guided_json": json.dumps(SCHEMA)}, StructuredOutputsParams(json=SCHEMA)),
    ({"guided_regex": "[a-z]+"}, StructuredOutputsParams(regex="[a-z]+")),
    ({"guided_choice": ["x", "y"]}, StructuredOutputsParams(choice=["x", "y"])),
    ({"guided_grammar": 'root ::= "a"'}, StructuredOutputsParams(grammar='root ::= "a"')),
    (
        {"structural_tag": {"structures": [], "triggers": []}},
        StructuredOutputsParams(structural_tag='{"structures": [], "triggers": []}'),
    ),
    (
        {
            "response_format": {
                "type": "structural_tag",
                "structures": [{"begin": "<f>"}],
                "triggers": ["<f>"],
            }
        },
        StructuredOutputsParams(
            structural_tag=json.dumps({"structures": [{"begin": "<f>"}], "triggers": ["<f>"]})
        ),
    ),
]


@pytest.mark.parametrize(("fields", "expected"), FORMS)
def test_each_request_form_maps_onto_one_constraint(fields, expected):
    for req in (_chat(**fields), CompletionRequest(prompt="p", **fields)):
        c = constraint_of(req)
        assert to_params(c) == expected


def test_no_constraint_and_text_format_are_unconstrained():
    assert constraint_of(_chat()) is None
    assert constraint_of(_chat(response_format={"type": "text"})) is None
    assert constraint_of(_chat(guided_decoding_backend="guidance", guided_whitespace_pattern=" ")) is None


TWO = [
    ({"guided_json": SCHEMA, "guided_regex": "a"}, ("guided_json", "guided_regex")),
    (
        {"response_format": {"type": "json_object"}, "guided_choice": ["a"]},
        ("response_format", "guided_choice"),
    ),
    (
        {"structured_outputs": {"regex": "a", "choice": ["b"]}},
        ("structured_outputs.regex", "structured_outputs.choice"),
    ),
    (
        {"structured_outputs": {"json_object": True}, "structural_tag": "{}"},
        ("structured_outputs.json_object", "structural_tag"),
    ),
]


@pytest.mark.parametrize(("fields", "names"), TWO)
def test_two_constraints_are_a_400_naming_both(app, fields, names):
    client, _, _ = app
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="fake", messages=MSG, extra_body=fields)
    message = e.value.body["message"]
    assert all(n in message for n in names), message
    assert e.value.body["param"] in names


BAD_TYPES = [
    ({"guided_choice": "abc"}, "guided_choice"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_choice": ["a", 1]}, "guided_choice"),
    ({"guided_json": 5}, "guided_json"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"guided_json": True}, "guided_json"),
    ({"guided_regex": 3}, "guided_regex"),
    ({"guided_grammar": ""}, "guided_grammar"),
    ({"structured_outputs": "regex"}, "structured_outputs"),
    ({"structured_outputs": {"regexp": "a"}}, "structured_outputs.regexp"),
    ({"structured_outputs": {"json_object": "yes"}}, "structured_outputs.json_object"),
    # No constraint: vLLM's StructuredOutputsParams needs exactly one; options alone are none.
    ({"structured_outputs": {}}, "structured_outputs"),
    ({"structured_outputs": {"disable_any_whitespace": True}}, "structured_outputs"),
    ({"structured_outputs": {"json_object": False}}, "structured_outputs"),
    ({"guided_decoding_backend": 3, "guided_regex": "a"}, "guided_decoding_backend"),
    ({"guided_decoding_backend": "outlines", "guided_regex": "a"}, "guided_decoding_backend"),
    ({"guided_decoding_backend": "xgrammar", "guided_regex": "a"}, "guided_decoding_backend"),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
        "response_format.json_schema",
    ),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}},
        "response_format",
    ),
]


@pytest.mark.parametrize(("fields", "param"), BAD_TYPES)
def test_wrong_types_are_a_400_naming_the_field(app, fields, param):
    client, _, engine = app
    before = len(engine.calls)
    for create in (
        lambda: client.chat.completions.create(model="fake", messages=MSG, extra_body=fields),
        lambda: client.completions.create(model="fake", prompt="p", extra_body=fields),
    ):
        with pytest.raises(openai.BadRequestError) as e:
            create()
        assert e.value.body["param"] == param, e.value.body
    assert len(engine.calls) == before  # nothing reached the engine


def _deep_schema(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


BAD_CONSTRAINTS = [
    ("invalid-schema", {"guided_json": {"type": "objekt"}}, "guided_json", "objekt"),
    (
        "unsatisfiable-schema",
        {"guided_json": {"type": "string", "minLength": 5, "maxLength": 2}},
        "guided_json",
        "minLength",
    ),
    ("invalid-regex", {"guided_regex": "[a-"}, "guided_regex", "unclosed character class"),
    ("invalid-grammar", {"guided_grammar": "start: foo"}, "guided_grammar", "foo"),
    ("invalid-gbnf", {"guided_grammar": "root ::= ("}, "guided_grammar", "Expected ')'"),
    (
        "gbnf-unknown-rule",
        {"structured_outputs": {"grammar": "root ::= a"}},
        "structured_outputs.grammar",
        "'a'",
    ),
    ("unmatchable-grammar", {"guided_grammar": "start: /[^\\s\\S]/"}, "guided_grammar", "matches no output"),
    (
        "unmatchable-regex",
        {"structured_outputs": {"regex": "[^\\s\\S]"}},
        "structured_outputs.regex",
        "matches no output",
    ),
    ("deep-schema", {"guided_json": _deep_schema(200)}, "guided_json", "deeper than"),
    (
        "oversize-schema",
        {"guided_json": {"enum": ["x" * MAX_CONSTRAINT_CHARS]}},
        "guided_json",
        "longer than",
    ),
    ("oversize-regex", {"guided_regex": "a" * (MAX_CONSTRAINT_CHARS + 1)}, "guided_regex", "longer than"),
    ("deep-regex", {"guided_regex": "(" * 5000 + "a" + ")" * 5000}, "guided_regex", "invalid regex"),
    (
        # llguidance's parser would end the answer at its first token: refused, with what to write.
        "crowded-grammar",
        {"structured_outputs": {"grammar": "start: " + " | ".join(f'"{i}"' for i in range(60_000))}},
        "structured_outputs.grammar",
        "60000 alternatives at once",
    ),
]


@pytest.mark.parametrize(
    ("fields", "param", "says"), [c[1:] for c in BAD_CONSTRAINTS], ids=[c[0] for c in BAD_CONSTRAINTS]
)
def test_a_bad_constraint_is_a_400_and_the_server_answers_after(app, fields, param, says):
    client, _, engine = app
    before = len(engine.calls)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="fake", messages=MSG, extra_body=fields)
    assert e.value.body["param"] == param and says in e.value.body["message"], e.value.body
    assert "\n" not in e.value.body["message"]
    assert len(engine.calls) == before
    ok = client.chat.completions.create(model="fake", messages=MSG, extra_body={"guided_regex": "a+"})
    assert ok.choices[0].message.content == '{"a": 1}'
    assert engine.calls[-1][2].structured_outputs == StructuredOutputsParams(regex="a+")


@pytest.mark.parametrize(
    ("wrap", "param"),
    [
        (lambda schema: '"guided_json": ' + schema, "guided_json"),
        (lambda schema: '"structured_outputs": {"json": ' + schema + "}", "structured_outputs.json"),
        (
            lambda s: '"response_format": {"type": "json_schema", "json_schema": {"schema": ' + s + "}}",
            "response_format",
        ),
    ],
)
def test_a_10k_deep_schema_is_a_400_naming_the_field(app, wrap, param):
    # Too deep for any JSON parser's recursion (the SDK's encoder too): sent as raw text.
    _, http, _ = app
    depth = 10_000
    schema = '{"type": "array", "items": ' * depth + '{"type": "string"}' + "}" * depth
    body = '{"model": "fake", "messages": [{"role": "user", "content": "hi"}], ' + wrap(schema) + "}"
    r = http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    ok = http.post("/v1/chat/completions", json={"model": "fake", "messages": MSG, "guided_json": SCHEMA})
    assert ok.status_code == 200


def test_redos_regex_is_served(app):
    # llguidance's lexer is a lazy DFA, linear in the input: (a+)+$ compiles and is served.
    client, _, engine = app
    client.completions.create(model="fake", prompt="p", extra_body={"guided_regex": "(a+)+$"})
    assert engine.calls[-1][2].structured_outputs == StructuredOutputsParams(regex="(a+)+$")


def test_openai_sdk_parse_sends_the_pydantic_schema(app):
    from pydantic import BaseModel

    class Answer(BaseModel):
        a: int

    client, _, engine = app
    parsed = client.chat.completions.parse(model="fake", messages=MSG, response_format=Answer)
    assert parsed.choices[0].message.parsed == Answer(a=1)
    sent = json.loads(engine.calls[-1][2].structured_outputs.json)
    assert sent["properties"]["a"]["type"] == "integer" and sent["additionalProperties"] is False


def test_n_samples_each_carry_the_constraint(app):
    client, _, engine = app
    client.chat.completions.create(model="fake", messages=MSG, n=2, extra_body={"guided_choice": ["a", "b"]})
    assert [c[2].structured_outputs for c in engine.calls[-2:]] == [
        StructuredOutputsParams(choice=["a", "b"])
    ] * 2


def _client_with_backend(tokenizer, backend: str):
    args = ServerArgs(serving=ServingOptions())
    engine = ScriptedEngine(tokenizer, ["x"])
    engine.config = SimpleNamespace(runner="generate", pooler_config=None, guided_decoding_backend=backend)
    http = TestClient(build_app(engine, args, AppState(args, Admission(8, -1))))
    return openai.OpenAI(
        base_url="http://testserver/v1", api_key="none", http_client=http, max_retries=0
    ), engine


def test_backend_off_refuses_constrained_requests_only(tokenizer):
    client, engine = _client_with_backend(tokenizer, "off")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="fake", messages=MSG, response_format={"type": "json_object"})
    assert e.value.body["param"] == "response_format" and "off" in e.value.body["message"]
    assert client.chat.completions.create(model="fake", messages=MSG).choices[0].message.content == "x"
    assert engine.calls[-1][2].structured_outputs is None


def test_request_backend_must_be_the_servers(tokenizer):
    client, engine = _client_with_backend(tokenizer, "guidance")
    for same in ("guidance", "auto"):
        client.completions.create(
            model="fake", prompt="p", extra_body={"guided_regex": "a", "guided_decoding_backend": same}
        )
        assert engine.calls[-1][2].structured_outputs == StructuredOutputsParams(regex="a")


def test_reasoning_markers_place_the_block_and_the_constraint_after_it(tokenizer):
    """A constraint starts after the block's end tag (ReasoningMarkers.end), or from the first token
    (None) when no reasoning is coming; `start` empty: the output starts inside the block."""
    end, start = [7, 8], [5, 6]

    def encode(text):
        return {"</think>": end, "<think>": start}[text]

    qwen3_template = "{% for m in messages %}...{% endfor %}<think></think>"
    # No parser: from the first token.
    assert reasoning_markers(None, encode, "prompt", qwen3_template) is None
    # Qwen3 thinking: the model opens the block itself; the template knows the tag.
    markers = reasoning_markers(ThinkParser, encode, "<|im_start|>assistant\n", qwen3_template)
    assert (markers.start, markers.end) == (start, end)
    # enable_thinking: false: the prompt closes an empty block, so no reasoning comes.
    closed = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert reasoning_markers(ThinkParser, encode, closed, qwen3_template) is None
    # DeepSeek-R1 / ERNIE: the prompt opens the block (or the parser's model starts inside it).
    for prompt in ("<｜Assistant｜><think>\n", "<｜Assistant｜>"):
        markers = reasoning_markers(DeepSeekR1Parser, encode, prompt, None)
        assert (markers.start, markers.end) == ([], end)
    # ERNIE-x1: its template opens the block, or closes an empty one with enable_thinking false.
    from fdcli_engine.entrypoints.openai.reasoning_ernie import ErnieX1ReasoningParser as Ernie

    assert reasoning_markers(Ernie, encode, "Assistant: <think>\n", None).end == end
    assert reasoning_markers(Ernie, encode, "Assistant: <think>\n\n</think>\n\n", None) is None
    # A template that never thinks, served with a reasoning parser: from the first token.
    assert reasoning_markers(ThinkParser, encode, "<|im_start|>assistant\n", "{{ messages }}") is None


def test_chat_with_reasoning_parser_sets_the_end_tag(tokenizer):
    template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
    )
    client, _, engine = scripted_client(tokenizer, ["x"], reasoning_parser="qwen3", chat_template=template)
    client.chat.completions.create(model="fake", messages=MSG, extra_body={"guided_regex": "x"})
    assert engine.calls[-1][2].structured_outputs.start_after_token_ids == tokenizer.encode(
        "</think>", add_special_tokens=False
    )
    client.chat.completions.create(
        model="fake",
        messages=MSG,
        extra_body={"guided_regex": "x", "chat_template_kwargs": {"enable_thinking": False}},
    )
    assert engine.calls[-1][2].structured_outputs.start_after_token_ids == []


def test_responses_api_text_format_json_schema(app):
    client, _, engine = app
    r = client.responses.create(
        model="fake",
        input="hi",
        text={"format": {"type": "json_schema", "name": "x", "schema": SCHEMA, "strict": True}},
    )
    assert r.output_text == '{"a": 1}'
    assert engine.calls[-1][2].structured_outputs == StructuredOutputsParams(json=SCHEMA)
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(
            model="fake",
            input="hi",
            text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "objekt"}}},
        )
    assert e.value.body["param"] == "text.format"


def test_responses_api_echoes_the_applied_text_format_and_ignores_none_of_it(tokenizer):
    """OpenAI repeats the request's text.format in the response; fd applies name, schema, strict and
    description, so none of them is named in fd-ignored-fields (nor refused when strict)."""
    client, _, _ = scripted_client(tokenizer, ['{"a": 1}'], strict_request_fields=True)
    fmt = {"type": "json_schema", "name": "x", "description": "an a", "schema": SCHEMA, "strict": True}
    raw = client.responses.with_raw_response.create(model="fake", input="hi", text={"format": fmt})
    assert "fd-ignored-fields" not in raw.headers
    r = raw.parse()
    assert r.text.format.model_dump(by_alias=True, exclude_none=True) == fmt
    assert r.text.format.schema_ == SCHEMA
    events = list(client.responses.create(model="fake", input="hi", text={"format": fmt}, stream=True))
    assert {e.type: e.response.text.format.name for e in events if hasattr(e, "response")} == {
        "response.created": "x",
        "response.in_progress": "x",
        "response.completed": "x",
    }
    for other in ({"type": "json_object"}, {"type": "text"}):
        assert (
            client.responses.create(model="fake", input="hi", text={"format": other}).text.format.type
            == (other["type"])
        )
    assert client.responses.create(model="fake", input="hi").text.format.type == "text"
    loose, http, _ = scripted_client(tokenizer, ['{"a": 1}'])
    body = {"model": "fake", "input": "hi", "text": {"format": {**fmt, "frobnicate": 1}}}
    r = http.post("/v1/responses", json=body)
    assert r.headers["fd-ignored-fields"] == "text.format.frobnicate"
    assert r.json()["text"]["format"] == fmt


def test_sdk_structured_requests_pass_strict_request_fields(tokenizer):
    # Every key the SDK and vLLM clients send is a declared field: nothing is "unknown".
    from pydantic import BaseModel

    class Answer(BaseModel):
        a: int

    client, http, _ = scripted_client(tokenizer, ['{"a": 1}'], strict_request_fields=True)
    assert (
        client.chat.completions.parse(model="fake", messages=MSG, response_format=Answer)
        .choices[0]
        .message.parsed
    )
    body = {"model": "fake", "messages": MSG, "guided_regex": "a", "guided_decoding_backend": "auto"}
    assert (
        http.post("/v1/chat/completions", json={**body, "guided_whitespace_pattern": " "}).status_code == 200
    )
    tag = {"type": "structural_tag", "structures": [], "triggers": []}
    r = http.post("/v1/chat/completions", json={"model": "fake", "messages": MSG, "response_format": tag})
    # Declared keys: served, or (while the backend lacks structural tags) a 400 about the tag itself.
    assert r.status_code == 200 or (
        r.json()["error"]["param"] == "response_format" and "Unrecognized" not in r.text
    ), r.text
