"""The in-flight window and the reorder buffer stay within their bounds while a slow request holds the
head of the output, and the output stays in input order (model-free engine)."""

from __future__ import annotations

import asyncio

from batch_helpers import completion_line, read_jsonl, write_jsonl
from fake_engine import FakeEngine

from fdcli_engine.entrypoints.batch.dispatcher import BatchDispatcher
from fdcli_engine.entrypoints.batch.files import OutputWriter, partial_path
from fdcli_engine.entrypoints.openai.serving_layer import build_serving
from fdcli_engine.entrypoints.openai.serving_options import ServingOptions


class SlowHeadEngine(FakeEngine):
    """The prompt "slow" finishes only once `hold` other requests have finished after it started (counted,
    not timed: the dispatcher prepares lines on threads, so a fixed number of loop turns would depend on
    the machine's load). A bounded wait: a dispatcher that never lets them run fails the asserts, it
    does not hang."""

    def __init__(self, hold: int):
        super().__init__()
        self.hold = hold
        self.inflight = 0
        self.max_inflight = 0
        self.finished_fast = 0

    async def generate(self, prompt_token_ids, params, request_id, prompt=None):
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            if prompt == "slow":
                start = self.finished_fast
                for _ in range(200_000):
                    if self.finished_fast - start >= self.hold:
                        break
                    await asyncio.sleep(0)
            else:
                await asyncio.sleep(0)
            async for out in super().generate(prompt_token_ids, params, request_id, prompt):
                yield out
            if prompt != "slow":
                self.finished_fast += 1
        finally:
            self.inflight -= 1


def test_slow_head_request_bounds_inflight_and_reorder_buffer(tmp_path):
    n, window, reorder = 200, 4, 20
    lines = [completion_line(f"r{i}", "slow" if i % 50 == 0 else f"fast {i}", 2) for i in range(n)]
    lines[17] = "not json"  # immediate error records count against the reorder buffer too
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    partial_path(out).write_bytes(b"")
    # r0 holds the head until r1..r20 are buffered: 19 of them are fast, r17 an immediate error record.
    engine = SlowHeadEngine(hold=reorder - 1)
    writer = OutputWriter(out)
    runner = BatchDispatcher(
        build_serving(engine, ServingOptions(["tiny"])), writer, window, reorder_limit=reorder
    )
    summary = asyncio.run(runner.run(src))
    writer.close()
    assert (summary.succeeded, summary.failed) == (n - 1, 1)
    assert engine.max_inflight == window == runner.max_inflight_seen  # the window was used, not exceeded
    assert runner.max_buffered_seen == reorder  # the slow head filled the buffer up to its bound
    records = read_jsonl(partial_path(out))
    assert [r["custom_id"] for r in records] == [None if i == 17 else f"r{i}" for i in range(n)]


def test_reasoning_parser_splits_like_the_server_and_unknown_parser_fails_first(tmp_path):
    import pytest

    from fdcli_engine.entrypoints.batch import BatchOptions, run_batch
    from fdcli_engine.errors import ConfigError

    src = write_jsonl(tmp_path / "in.jsonl", [completion_line("c", "x", 50), completion_line("d", "y", 50)])
    src.write_text(
        src.read_text()
        .replace('"/v1/completions"', '"/v1/chat/completions"')
        .replace('"prompt": "x"', '"messages": [{"role": "user", "content": "x"}]')
        .replace('"prompt": "y"', '"messages": [{"role": "user", "content": "y"}]')
    )
    out = tmp_path / "out.jsonl"
    opts = BatchOptions(src, out, progress=False, serving=ServingOptions(reasoning_parser="qwen3"))
    summary = run_batch(opts, {}, lambda _: FakeEngine(reply="<think>because</think>42"))
    assert summary.succeeded == 2, read_jsonl(out)
    message = read_jsonl(out)[0]["response"]["body"]["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("because", "42")

    def never(_):
        raise AssertionError("the engine must not be built")

    with pytest.raises(ConfigError):
        run_batch(
            BatchOptions(
                src, tmp_path / "o2.jsonl", progress=False, serving=ServingOptions(reasoning_parser="nope")
            ),
            {},
            never,
        )
