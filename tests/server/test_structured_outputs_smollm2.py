"""Structured outputs end to end on the real SmolLM2 behind `fd serve`, with the clients people use
unchanged: the openai SDK's `chat.completions.parse(response_format=Model)` and its streaming helper
return objects that validate; completions with guided_regex / guided_choice match; a run-batch line
with response_format gives JSON that validates against its schema. Few tokens each."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from fd_server import REPO
from pydantic import BaseModel, Field

pytestmark = pytest.mark.slow


class City(BaseModel):
    name: str = Field(max_length=24)
    population: int = Field(ge=0, le=100_000_000)


MSG = [{"role": "user", "content": "Describe Paris as JSON with its name and population."}]


@pytest.fixture
def smol(smol_server):
    return smol_server


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_sdk_parse_returns_a_valid_object(smol, temperature):
    client = smol.client()
    r = client.chat.completions.parse(
        model=client.models.list().data[0].id,
        messages=MSG,
        response_format=City,
        max_tokens=48,
        temperature=temperature,
        seed=1,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    assert isinstance(choice.message.parsed, City)
    City.model_validate_json(choice.message.content)  # the text itself validates


def test_sdk_streaming_helper_returns_a_valid_object(smol):
    client = smol.client()
    with client.chat.completions.stream(
        model=client.models.list().data[0].id,
        messages=MSG,
        response_format=City,
        max_tokens=48,
        temperature=0,
    ) as stream:
        deltas = [e.delta for e in stream if e.type == "content.delta"]
        final = stream.get_final_completion()
    assert len(deltas) > 1  # streamed, not one piece
    assert isinstance(final.choices[0].message.parsed, City)
    assert "".join(deltas) == final.choices[0].message.content


def test_completions_regex_and_choice_match(smol):
    client = smol.client()
    model = client.models.list().data[0].id
    r = client.completions.create(
        model=model,
        prompt="A phone number:",
        max_tokens=12,
        temperature=1.0,
        seed=3,
        extra_body={"guided_regex": r"[0-9]{3}-[0-9]{4}"},
    )
    assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", r.choices[0].text), r.choices[0].text
    r = client.completions.create(
        model=model,
        prompt="Is the sky blue?",
        max_tokens=4,
        temperature=0,
        extra_body={"structured_outputs": {"choice": ["yes", "no"]}},
    )
    assert r.choices[0].text in ("yes", "no")


def test_run_batch_line_with_response_format(tmp_path):
    import jsonschema

    schema = {**City.model_json_schema(), "additionalProperties": False}
    line = {
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "messages": MSG,
            "max_tokens": 48,
            "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": schema}},
        },
    }
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(json.dumps(line) + "\n")
    cmd = [
        sys.executable,
        "-m",
        "fdcli.main",
        "run-batch",
        "-i",
        str(src),
        "-o",
        str(out),
        "--max-model-len",
        "512",
        "--threads",
        "1",
    ]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (rec,) = [json.loads(x) for x in out.read_text().splitlines()]
    content = rec["response"]["body"]["choices"][0]["message"]["content"]
    jsonschema.validate(json.loads(content), schema)


def test_responses_parse_create_and_stream_return_valid_objects(smol):
    """/v1/responses with the SDK's own structured-output entry points: `responses.parse(text_format=
    Model)`, `responses.create(text={"format": {"type": "json_schema", ...}})` (the flat Responses
    shape) and `responses.stream(text_format=Model)`: each answer validates, and the stream's deltas
    add up to it."""
    client = smol.client()
    model = client.models.list().data[0].id
    body = dict(model=model, input=MSG, max_output_tokens=48, temperature=0)
    parsed = client.responses.parse(**body, text_format=City)
    assert parsed.status == "completed", parsed.output_text
    assert isinstance(parsed.output_parsed, City)
    schema = {**City.model_json_schema(), "additionalProperties": False}
    fmt = {"type": "json_schema", "name": "city", "schema": schema, "strict": True}
    created = client.responses.create(**body, text={"format": fmt})
    assert created.status == "completed" and created.text.format.name == "city"
    City.model_validate_json(created.output_text)
    assert created.output_text == parsed.output_text  # the same grammar, greedy
    with client.responses.stream(**body, text_format=City) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert len(deltas) > 1 and "".join(deltas) == final.output_text == parsed.output_text
    assert isinstance(final.output_parsed, City)


def test_responses_streamed_call_arguments_add_up_to_the_call(smol):
    """A forced function call on the real model, streamed: the arguments arrive in several
    function_call_arguments.delta events that add up to the .done arguments and the whole response's,
    which validate against the tool's parameters."""
    client = smol.client()
    tool = {
        "type": "function",
        "name": "get_city",
        "description": "Look a city up",
        "parameters": {**City.model_json_schema(), "additionalProperties": False},
        "strict": True,
    }
    body = dict(
        model=client.models.list().data[0].id,
        input=MSG,
        tools=[tool],
        tool_choice={"type": "function", "name": "get_city"},
        max_output_tokens=48,
        temperature=0,
    )
    whole = client.responses.create(**body)
    with client.responses.stream(**body) as stream:
        events = list(stream)
        final = stream.get_final_response()
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    (call,) = final.output
    assert call.type == "function_call" and call.name == "get_city" and call.status == "completed"
    assert (
        len(deltas) > 1 and "".join(deltas) == done.arguments == call.arguments == whole.output[0].arguments
    )
    City.model_validate_json(call.arguments)
