"""`fd run-batch` lines carry the structured-output fields of `fd serve` (same serving layer): each
reaches the engine as its StructuredOutputsParams, and a bad constraint is that line's 400 record
naming the field while the other lines succeed."""

from __future__ import annotations

import json

from batch_helpers import chat_line, completion_line, read_jsonl, write_jsonl
from fake_engine import FakeEngine

from fdcli_engine.entrypoints.batch import BatchOptions, run_batch
from fdcli_engine.entrypoints.openai.serving_options import ServingOptions
from fdcli_engine.structured_output import StructuredOutputsParams

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


class RecordingEngine(FakeEngine):
    """FakeEngine over fd's tiny tokenizer (the grammar backend reads its vocabulary); records params."""

    def __init__(self, tokenizer):
        super().__init__('{"a": 1}', finish_reason="stop")
        self.tokenizer = tokenizer
        self.model_config.vocab_size = tokenizer.vocab_size
        self.seen = {}

    async def generate(self, prompt_token_ids, params, request_id, prompt=None):
        self.seen[request_id] = params.structured_outputs
        async for out in super().generate(prompt_token_ids, params, request_id, prompt):
            yield out


def test_lines_with_constraints(tmp_path):
    from tiny_models import write_tiny_tokenizer

    from fdcli_engine.tokenizer import Tokenizer

    engine = RecordingEngine(Tokenizer.from_model(write_tiny_tokenizer(tmp_path / "tok")))
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
    lines = [
        chat_line("schema", "hi", 64, response_format=fmt, request_id="schema"),
        completion_line("choice", "hi", 8, guided_choice=["yes", "no"], request_id="choice"),
        chat_line("bad-regex", "hi", 8, guided_regex="[a-"),
        chat_line("two", "hi", 8, guided_regex="a", guided_json=SCHEMA),
    ]
    out = tmp_path / "out.jsonl"
    summary = run_batch(
        BatchOptions(
            write_jsonl(tmp_path / "in.jsonl", lines), out, progress=False, serving=ServingOptions()
        ),
        {},
        lambda _: engine,
    )
    recs = {r["custom_id"]: r for r in read_jsonl(out)}
    assert summary.succeeded == 2 and summary.failed == 2
    body = recs["schema"]["response"]["body"]
    assert json.loads(body["choices"][0]["message"]["content"]) == {"a": 1}
    assert engine.seen["schema"] == StructuredOutputsParams(json=SCHEMA)
    assert engine.seen["choice"] == StructuredOutputsParams(choice=["yes", "no"])
    for cid, param in (("bad-regex", "guided_regex"), ("two", "guided_regex")):
        resp = recs[cid]["response"]
        assert resp["status_code"] == 400 and resp["body"]["error"]["param"] == param, resp
