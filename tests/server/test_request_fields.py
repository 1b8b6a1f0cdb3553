"""The request-field policy through the official openai SDK (an in-process app, scripted engine):
every documented OpenAI parameter and message field is accepted, unknown ones are ignored and named in
the `fd-ignored-fields` header (logged once), or refused with OpenAI's 400 under
--strict-request-fields."""

from __future__ import annotations

import logging
import typing

import openai
import pytest
from scripted import scripted_client

from fdcli_engine.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    StreamOptions,
)
from fdcli_engine.entrypoints.openai.protocol_pooling import ChatRewardRequest
from fdcli_engine.entrypoints.openai.request_fields import unknown_fields

PIECES = ["The", " answer", " is", " 42"]
MSG = [{"role": "user", "content": "hi"}]


def _sdk_keys(typed_dict) -> set[str]:
    return set(typing.get_type_hints(typed_dict))


def test_every_sdk_parameter_is_a_declared_field():
    # The installed SDK is the reference list: a parameter it documents is never an "unknown" field.
    from openai.types import completion_create_params as cmpl
    from openai.types.chat import ChatCompletionAssistantMessageParam, ChatCompletionStreamOptionsParam
    from openai.types.chat import completion_create_params as chat

    assert _sdk_keys(chat.CompletionCreateParamsBase) - set(ChatCompletionRequest.model_fields) == set()
    assert _sdk_keys(cmpl.CompletionCreateParamsBase) - set(CompletionRequest.model_fields) == set()
    assert _sdk_keys(ChatCompletionAssistantMessageParam) - set(ChatMessage.model_fields) == set()
    assert _sdk_keys(ChatCompletionStreamOptionsParam) - set(StreamOptions.model_fields) == set()


def test_openai_parameters_and_a_returned_message_are_accepted(tokenizer):
    client, _, engine = scripted_client(tokenizer, PIECES)
    first = client.chat.completions.create(model="fake", messages=MSG)
    assert first.choices[0].message.content == "The answer is 42"
    # How apps continue a conversation: the response message dumped back (refusal, annotations, ...).
    history = [*MSG, first.choices[0].message.model_dump(), {"role": "user", "content": "why?"}]
    assert {"refusal", "annotations", "audio", "function_call"} <= set(history[1])
    raw = client.chat.completions.with_raw_response.create(
        model="fake",
        messages=history,
        store=True,
        metadata={"team": "a"},
        service_tier="auto",
        reasoning_effort="low",
        prompt_cache_key="k1",
        safety_identifier="u-1",
        modalities=["text"],
        prediction={"type": "content", "content": "The answer"},
        verbosity="low",
        web_search_options={},
        user="u-1",
        parallel_tool_calls=False,
        functions=[{"name": "f", "parameters": {"type": "object"}}],
        function_call="auto",
        stream_options=None,
    )
    assert raw.headers.get("fd-ignored-fields") is None
    assert raw.parse().choices[0].message.content == "The answer is 42"
    # The dumped assistant message reached the template as a plain assistant turn.
    assert "<|im_start|>assistant\nThe answer is 42<|im_end|>" in engine.calls[-1].prompt


def test_fastdeploy_and_vllm_extensions_are_accepted():
    body = {
        "messages": MSG,
        "metadata": {"min_dec_len": 1},
        "mm_processor_kwargs": {"max_pixels": 100},
        "priority": 3,
        "reasoning_max_tokens": 8,
        "chat_template_kwargs": {"enable_thinking": False},
        "max_streaming_response_tokens": 2,
    }
    assert unknown_fields(ChatCompletionRequest.model_validate(body)) == []
    # The seed's /v1/chat/reward request carries mm_processor_kwargs.
    reward = {"model": "r", "messages": MSG, "mm_processor_kwargs": {"max_pixels": 1}, "metadata": {}}
    assert unknown_fields(ChatRewardRequest.model_validate(reward)) == []


def test_unknown_fields_are_ignored_named_in_the_header_and_logged_once(tokenizer, caplog):
    client, _, _ = scripted_client(tokenizer, PIECES)
    messages = [{"role": "user", "content": "hi", "colour": "red"}]
    caplog.set_level(logging.WARNING, logger="fd.serve")
    for stream in (False, True, False):
        raw = client.chat.completions.with_raw_response.create(
            model="fake", messages=messages, stream=stream, extra_body={"frobnicate": 1, "top_n": 2}
        )
        assert raw.headers["fd-ignored-fields"] == "frobnicate,top_n,messages[0].colour"
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
        else:
            text = raw.parse().choices[0].message.content
        assert text == "The answer is 42"
    logged = [r.getMessage() for r in caplog.records if "unknown request field" in r.getMessage()]
    assert len(logged) == 3  # once per field name, not per request
    assert any("'messages[].colour'" in m for m in logged)
    raw = client.completions.with_raw_response.create(model="fake", prompt="hi", extra_body={"typo_n": 2})
    assert raw.headers["fd-ignored-fields"] == "typo_n"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": MSG, "frobnicate": 1}, "frobnicate"),
        ({"messages": [{**MSG[0], "colour": "red"}]}, "messages[0].colour"),
        (
            {"messages": MSG, "stream": True, "stream_options": {"include_usage": True, "x": 1}},
            "stream_options.x",
        ),
    ],
)
def test_strict_request_fields_answers_openais_400(tokenizer, body, param):
    client, http, engine = scripted_client(tokenizer, PIECES, strict_request_fields=True)
    r = http.post("/v1/chat/completions", json={"model": "fake", **body})
    assert r.status_code == 400
    assert r.json() == {
        "error": {
            "message": f"Unrecognized request argument supplied: {param}",
            "type": "invalid_request_error",
            "param": param,
            "code": None,
        }
    }
    assert engine.calls == []
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="fake", prompt="hi", extra_body={"frobnicate": 1})
    assert e.value.param == "frobnicate" and "Unrecognized request argument" in e.value.message
    # Documented fields stay accepted under strict mode.
    assert client.chat.completions.create(model="fake", messages=MSG, store=True).choices[0].message.content


def test_strict_request_fields_from_flag_and_config(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    import fdcli_engine.entrypoints.openai.launcher as launcher
    from fdcli.main import app

    seen = []
    monkeypatch.setattr(launcher, "run_server", lambda config, args, **kw: seen.append(args.serving) or 0)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("strict-request-fields: true\n")
    for argv in (["serve", "--strict-request-fields"], ["serve", "--config", str(cfg)], ["serve"]):
        result = CliRunner().invoke(app, argv)
        assert result.exit_code == 0, result.output
    assert [s.strict_request_fields for s in seen] == [True, True, False]


def test_hostile_field_names_give_a_safe_header(tokenizer):
    # Field names are client text: control characters, non-Latin-1 letters and commas must neither
    # break the response nor forge extra names; many names cut the header, not the request.
    _, http, _ = scripted_client(tokenizer, PIECES)
    body = {"prompt": "hi", "\x1f": None, "Ā": 1, "a,b": 2}
    r = http.post("/tokenize", json=body)
    assert r.status_code == 200, r.text
    assert r.headers["fd-ignored-fields"] == "\\x1f,\\u0100,a\\x2cb"
    many = {"messages": MSG, **{f"field_{i:04d}": i for i in range(500)}}
    r = http.post("/v1/chat/completions", json=many)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "The answer is 42"
    header = r.headers["fd-ignored-fields"]
    assert len(header) == 1024 and header.startswith("field_0000,field_0001,") and header.endswith("...")


def test_unknown_fields_in_lists_of_scalars_and_of_models():
    """Token-id prompts (lists of ints, and lists of them) hold no fields; a list of models is walked
    item by item, so an unknown key in its second item is named with its index."""
    ids = list(range(100, 612))
    assert unknown_fields(CompletionRequest.model_validate({"prompt": ids, "max_tokens": 1})) == []
    batch = CompletionRequest.model_validate({"prompt": [ids, ids[:3]], "stop": ["a", "b"], "x": 1})
    assert unknown_fields(batch) == ["x"]
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    chat = ChatCompletionRequest.model_validate(
        {
            "messages": [*MSG, {"role": "user", "content": "again", "mood": "?"}],
            "tools": [tool, {**tool, "w": 2}],
        }
    )
    assert unknown_fields(chat) == ["messages[1].mood", "tools[1].w"]
