"""Tool calling end to end on the real SmolLM2-135M-Instruct (`fd serve --tool-call-parser hermes`):
tool_choice "required" and a named function are forced by the grammar, so the returned calls
validate (jsonschema) against the tools' parameters, streamed and not; with "auto" the hermes parser
returns either content or well-formed calls. SmolLM2's template has no `tools` variable, so the
tools reach the model through the system prompt."""

from __future__ import annotations

import json

import jsonschema
import pytest

pytestmark = pytest.mark.slow

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"type": "string", "maxLength": 12}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather of a city", "parameters": WEATHER},
    },
    {
        "type": "function",
        "function": {"name": "get_time", "description": "Time in a zone", "parameters": TIME},
    },
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
MODEL = "SmolLM2-135M-Instruct"  # conftest.SMOL_NAME


@pytest.fixture
def smol(smol_server):
    return smol_server


def _check_calls(calls) -> None:
    assert calls
    for call in calls:
        assert call.id.startswith("call_") and call.type == "function"
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def _streamed(client, **kw):
    with client.chat.completions.stream(**kw) as stream:
        return stream.get_final_completion().choices[0]


@pytest.mark.parametrize("temperature", [0, 1])
def test_required_returns_calls_that_validate(smol, temperature):
    client = smol.client()
    kw = dict(model=MODEL, messages=USER, tools=TOOLS, tool_choice="required", max_tokens=160, seed=7)
    kw["temperature"] = temperature
    whole = client.chat.completions.create(**kw).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.content is None
    _check_calls(whole.message.tool_calls)
    streamed = _streamed(client, **kw)
    assert [(c.function.name, c.function.arguments) for c in streamed.message.tool_calls] == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls
    ]
    one = client.chat.completions.create(**{**kw, "parallel_tool_calls": False}).choices[0]
    assert len(one.message.tool_calls) == 1
    _check_calls(one.message.tool_calls)


def test_named_tool_returns_its_call(smol):
    client = smol.client()
    named = {"type": "function", "function": {"name": "get_time"}}
    kw = dict(model=MODEL, messages=USER, tools=TOOLS, tool_choice=named, max_tokens=60, temperature=0)
    whole = client.chat.completions.create(**kw).choices[0]
    assert whole.finish_reason == "tool_calls"
    assert [c.function.name for c in whole.message.tool_calls] == ["get_time"]
    _check_calls(whole.message.tool_calls)
    streamed = _streamed(client, **kw)
    assert streamed.message.tool_calls[0].function.arguments == whole.message.tool_calls[0].function.arguments


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "ping"}}])
def test_a_function_without_parameters_is_called_with_no_arguments(smol, choice):
    """No `parameters` = no arguments (OpenAI's empty parameter list): the grammar allows only {}."""
    ping = [{"type": "function", "function": {"name": "ping", "description": "Check the service"}}]
    kw = dict(
        model=MODEL, messages=USER, tools=ping, tool_choice=choice, max_tokens=60, temperature=1, seed=5
    )
    calls = smol.client().chat.completions.create(**kw).choices[0].message.tool_calls
    assert calls and {(c.function.name, c.function.arguments) for c in calls} == {("ping", "{}")}


def test_auto_returns_content_or_well_formed_calls(smol):
    client = smol.client()
    for temperature in (0, 1):
        choice = client.chat.completions.create(
            model=MODEL, messages=USER, tools=TOOLS, max_tokens=80, temperature=temperature, seed=3
        ).choices[0]
        if choice.message.tool_calls:
            assert choice.finish_reason == "tool_calls"
            for call in choice.message.tool_calls:
                assert call.function.name and isinstance(json.loads(call.function.arguments), dict)
        else:
            assert isinstance(choice.message.content, str) and choice.message.content.strip()
