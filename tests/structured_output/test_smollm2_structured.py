"""Structured outputs on SmolLM2-135M (the default model, its real 49k tokenizer): a chat answer under a
JSON schema parses and validates, and a choice answer is one of the choices."""

from __future__ import annotations

import json

import jsonschema
import pytest

from fdcli_engine import LLM, SamplingParams
from fdcli_engine.structured_output import StructuredOutputsParams as SO

pytestmark = pytest.mark.slow

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "population_millions": {"type": "integer", "minimum": 0, "maximum": 50},
    },
    "required": ["city", "population_millions"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def llm():
    return LLM(None, max_model_len=512)


def test_chat_json_schema(llm):
    messages = [{"role": "user", "content": "Give the capital of France and its population as JSON."}]
    params = SamplingParams(temperature=0, max_tokens=48, structured_outputs=SO(json=SCHEMA))
    comp = llm.chat(messages, params)[0].outputs[0]
    assert comp.finish_reason == "stop", comp.text
    jsonschema.validate(json.loads(comp.text), SCHEMA)


def test_chat_choice_seeded(llm):
    messages = [{"role": "user", "content": "Is the sea wet? Answer yes or no."}]
    params = SamplingParams(
        temperature=1.0, seed=7, max_tokens=8, structured_outputs=SO(choice=["yes", "no"])
    )
    comp = llm.chat(messages, params)[0].outputs[0]
    assert comp.finish_reason == "stop"
    assert comp.text in ("yes", "no")
