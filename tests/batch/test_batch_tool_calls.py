"""`fd run-batch --tool-call-parser`: lines with tools get OpenAI tool_calls exactly as `fd serve` gives
them (same serving layer); without the parser such a line is one error record naming the flag."""

from __future__ import annotations

import json

import pytest
from batch_helpers import chat_line, read_jsonl, write_jsonl
from fake_engine import FakeEngine

from fdcli_engine.entrypoints.batch import BatchOptions, run_batch
from fdcli_engine.entrypoints.openai.serving_options import ServingOptions
from fdcli_engine.errors import ConfigError

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"location": {"type": "string"}}},
        },
    }
]
REPLY = (
    'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris"}}\n</tool_call>\n'
)


def _run(tmp_path, **opts):
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [chat_line("tools", "weather in Paris?", 256, tools=TOOLS), chat_line("plain", "hi", 256)],
    )
    out = tmp_path / "out.jsonl"
    summary = run_batch(
        BatchOptions(src, out, progress=False, serving=ServingOptions(**opts)),
        {},
        lambda _: FakeEngine(REPLY, finish_reason="stop"),
    )
    return summary, {r["custom_id"]: r for r in read_jsonl(out)}


def test_tool_calls_are_parsed_per_line(tmp_path):
    summary, recs = _run(tmp_path, tool_call_parser="ernie-x1")
    assert summary.succeeded == 2
    choice = recs["tools"]["response"]["body"]["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"location": "Paris"}
    assert choice["message"]["content"] == "Let me look."
    # A line without tools is not parsed: the same text stays content.
    plain = recs["plain"]["response"]["body"]["choices"][0]
    assert plain["message"]["content"] == REPLY and plain["message"].get("tool_calls") is None
    assert plain["finish_reason"] == "stop"


def test_without_the_parser_a_tools_line_is_an_error_record_naming_the_flag(tmp_path):
    summary, recs = _run(tmp_path)
    assert summary.succeeded == 1 and summary.failed == 1
    err = recs["tools"]["response"]
    assert err["status_code"] == 400
    assert "--tool-call-parser" in err["body"]["error"]["message"]
    assert recs["plain"]["response"]["status_code"] == 200


def test_unknown_parser_fails_before_the_engine_is_built(tmp_path):
    def never(_):
        raise AssertionError("the engine must not be built")

    src = write_jsonl(tmp_path / "in.jsonl", [chat_line("a", "x")])
    with pytest.raises(ConfigError, match="tool-call-parser"):
        run_batch(
            BatchOptions(
                src, tmp_path / "o.jsonl", progress=False, serving=ServingOptions(tool_call_parser="nope")
            ),
            {},
            never,
        )


def test_hermes_and_forced_tool_choice_lines(tmp_path):
    # The same serving layer as fd serve: a hermes reply parsed under --tool-call-parser hermes, and a
    # tool_choice "required" line that sends the engine the forcing grammar and reads its output.
    from tiny_models import write_tiny_tokenizer

    from fdcli_engine.tokenizer import Tokenizer

    forced = '[{"name": "get_weather", "parameters": {"location": "Paris"}}]'

    class Engine(FakeEngine):
        def __init__(self, tokenizer):
            super().__init__(REPLY, finish_reason="stop")
            self.tokenizer = tokenizer
            self.model_config.vocab_size = tokenizer.vocab_size
            self.seen = {}

        async def generate(self, prompt_token_ids, params, request_id, prompt=None):
            self.seen[request_id] = params.structured_outputs
            self.reply = forced if params.structured_outputs is not None else REPLY
            async for out in super().generate(prompt_token_ids, params, request_id, prompt):
                yield out

    engine = Engine(Tokenizer.from_model(write_tiny_tokenizer(tmp_path / "tok")))
    lines = [
        chat_line("auto", "weather in Paris?", 256, tools=TOOLS, request_id="auto"),
        chat_line(
            "required", "weather in Paris?", 256, tools=TOOLS, tool_choice="required", request_id="req"
        ),
    ]
    out = tmp_path / "out.jsonl"
    opts = BatchOptions(
        write_jsonl(tmp_path / "in.jsonl", lines),
        out,
        progress=False,
        serving=ServingOptions(tool_call_parser="hermes"),
    )
    summary = run_batch(opts, {}, lambda _: engine)
    recs = {r["custom_id"]: r["response"]["body"]["choices"][0] for r in read_jsonl(out)}
    assert summary.succeeded == 2
    for name in ("auto", "required"):
        (call,) = recs[name]["message"]["tool_calls"]
        assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == (
            "get_weather",
            {"location": "Paris"},
        )
        assert recs[name]["finish_reason"] == "tool_calls"
    assert engine.seen["auto"] is None and engine.seen["req"].kind == "json"
