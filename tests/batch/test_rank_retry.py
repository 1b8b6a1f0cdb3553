"""A line whose data-parallel rank dies under it runs again on a live rank, by the Ray actors' rule
(line_retry.py): a line that keeps killing ranks gets one `rank_died` error record after two, the
others their answers (model-free engine whose "ranks" die on cue)."""

from __future__ import annotations

import asyncio

from batch_helpers import completion_line, read_jsonl, write_jsonl
from fake_engine import FakeEngine

from fdcli_engine.api.protocol import EngineDeadError
from fdcli_engine.entrypoints.batch.dispatcher import BatchDispatcher
from fdcli_engine.entrypoints.batch.files import OutputWriter, partial_path
from fdcli_engine.entrypoints.batch.line_retry import MAX_ATTEMPTS
from fdcli_engine.entrypoints.openai.serving_layer import build_serving
from fdcli_engine.entrypoints.openai.serving_options import ServingOptions


class DyingRanksEngine(FakeEngine):
    """The prompt "doomed" kills every rank it reaches; "unlucky" only the first. The engine as a whole
    stays alive (other ranks are live), as AsyncLLM after one rank's death."""

    def __init__(self):
        super().__init__()
        self.seen: dict[str, int] = {}

    async def generate(self, prompt_token_ids, params, request_id, prompt=None):
        self.seen[prompt] = self.seen.get(prompt, 0) + 1
        if prompt == "doomed" or (prompt == "unlucky" and self.seen[prompt] == 1):
            raise EngineDeadError(f"data-parallel rank {self.seen[prompt]}: the engine core process exited")
        async for out in super().generate(prompt_token_ids, params, request_id, prompt):
            yield out


def test_lines_of_a_dead_rank_run_again_within_the_bound(tmp_path):
    prompts = ["fine 1", "unlucky", "doomed", "fine 2"]
    src = write_jsonl(tmp_path / "in.jsonl", [completion_line(f"r{i}", p, 3) for i, p in enumerate(prompts)])
    out = tmp_path / "out.jsonl"
    partial_path(out).write_bytes(b"")
    engine = DyingRanksEngine()
    writer = OutputWriter(out)
    runner = BatchDispatcher(build_serving(engine, ServingOptions(["tiny"])), writer, 4)
    summary = asyncio.run(runner.run(src))
    writer.close()
    records = read_jsonl(partial_path(out))
    assert [r["custom_id"] for r in records] == ["r0", "r1", "r2", "r3"]
    assert [r["response"]["body"]["choices"][0]["text"] for r in records if r["error"] is None] == ["ok!"] * 3
    error = records[2]["error"]
    assert error["code"] == "rank_died" and error["line"] == 3
    assert f"failed {MAX_ATTEMPTS} times" in error["message"] and "rank 2" in error["message"]
    assert engine.seen == {"fine 1": 1, "unlucky": 2, "doomed": MAX_ATTEMPTS, "fine 2": 1}
    assert (summary.succeeded, summary.failed, summary.retried) == (3, 1, 1 + MAX_ATTEMPTS - 1)
