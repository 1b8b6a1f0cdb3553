"""The in-flight window and the reorder buffer stay within their bounds while a slow request holds the
head of the output, and the output stays in input order (model-free engine)."""

from __future__ import annotations

import asyncio

from conftest import completion_line, read_jsonl, write_jsonl
from fake_engine import FakeEngine

from fdcli_engine.entrypoints.batch.files import OutputWriter, partial_path
from fdcli_engine.entrypoints.batch.runner import BatchRunner, Serving


class SlowHeadEngine(FakeEngine):
    """The prompt "slow" finishes only after every other request has had many chances to run."""

    def __init__(self):
        super().__init__()
        self.inflight = 0
        self.max_inflight = 0

    async def generate(self, prompt_token_ids, params, request_id, prompt=None):
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            if prompt == "slow":
                for _ in range(2000):
                    await asyncio.sleep(0)
            else:
                await asyncio.sleep(0)
            async for out in super().generate(prompt_token_ids, params, request_id, prompt):
                yield out
        finally:
            self.inflight -= 1


def test_slow_head_request_bounds_inflight_and_reorder_buffer(tmp_path):
    n, window, reorder = 200, 4, 20
    lines = [completion_line(f"r{i}", "slow" if i % 50 == 0 else f"fast {i}", 2) for i in range(n)]
    lines[17] = "not json"  # immediate error records count against the reorder buffer too
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    partial_path(out).write_bytes(b"")
    engine = SlowHeadEngine()
    writer = OutputWriter(out)
    runner = BatchRunner(Serving(engine, ["tiny"]), writer, window, reorder_limit=reorder)
    summary = asyncio.run(runner.run(src))
    writer.close()
    assert (summary.succeeded, summary.failed) == (n - 1, 1)
    assert engine.max_inflight == window == runner.max_inflight_seen  # the window was used, not exceeded
    assert runner.max_buffered_seen == reorder  # the slow head filled the buffer up to its bound
    records = read_jsonl(partial_path(out))
    assert [r["custom_id"] for r in records] == [None if i == 17 else f"r{i}" for i in range(n)]
