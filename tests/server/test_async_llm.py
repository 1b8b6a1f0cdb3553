"""AsyncLLM's routing, in-process with a stub in place of the engine-core socket: one request's fault
fails it alone, a cancelled consumer aborts its request in the core, a dead core fails everyone at once."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from fdcli_engine.api.async_llm import AsyncLLM, EngineDeadError, EngineRequestError
from fdcli_engine.api.core_messages import AbortRequest, AddRequest, OutputsMsg
from fdcli_engine.output_processor import OutputProcessor
from fdcli_engine.outputs import EngineCoreOutput
from fdcli_engine.resolved_config import ResolvedConfig
from fdcli_engine.sampling_params import SamplingParams


class StubClient:
    def __init__(self):
        self.sent = []
        self.on_dead = None

    def send(self, msg):
        self.sent.append(msg)


class FlakyProcessor(OutputProcessor):
    """Breaks on any output of request "bad" (as a detokenizer bug would)."""

    def process_outputs(self, outputs):
        if any(o.req_id == "bad" for o in outputs):
            raise RuntimeError("detokenizer exploded")
        return super().process_outputs(outputs)


def make_engine(tokenizer, processor_cls=OutputProcessor) -> AsyncLLM:
    eng = AsyncLLM(
        ResolvedConfig(model="stub", max_model_len=64), tokenizer, output_processor_cls=processor_cls
    )
    real = eng.client
    real._sync_ctx.term()
    shutil.rmtree(real._tmpdir, ignore_errors=True)
    eng.client = StubClient()
    eng.is_ready = True
    return eng


async def collect(eng, req_id):
    outs = []
    async for out in eng.generate([5, 6, 7], SamplingParams(max_tokens=4), req_id):
        outs.append(out)
    return outs


def test_a_faulty_request_fails_alone(tokenizer):
    async def scenario():
        eng = make_engine(tokenizer, FlakyProcessor)
        good = asyncio.create_task(collect(eng, "good"))
        bad = asyncio.create_task(collect(eng, "bad"))
        await asyncio.sleep(0)
        assert [m.req_id for m in eng.client.sent if isinstance(m, AddRequest)] == ["good", "bad"]
        eng._on_event(
            OutputsMsg(
                [EngineCoreOutput("good", [40], finish_reason="length"), EngineCoreOutput("bad", [41])]
            )
        )
        outs = await good
        with pytest.raises(EngineRequestError):
            await bad
        return eng, outs

    eng, outs = asyncio.run(scenario())
    assert outs[-1].finished and outs[-1].outputs[0].token_ids == [40]
    assert [m.req_ids for m in eng.client.sent if isinstance(m, AbortRequest)] == [["bad"]]
    assert eng.num_unfinished == 0


def test_cancelled_consumer_aborts_in_core(tokenizer):
    async def scenario():
        eng = make_engine(tokenizer)
        task = asyncio.create_task(collect(eng, "r1"))
        await asyncio.sleep(0)
        eng._on_event(OutputsMsg([EngineCoreOutput("r1", [40])]))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # A late output of the aborted request is dropped, not routed or crashing.
        eng._on_event(OutputsMsg([EngineCoreOutput("r1", [41])]))
        return eng

    eng = asyncio.run(scenario())
    assert [m.req_ids for m in eng.client.sent if isinstance(m, AbortRequest)] == [["r1"]]
    assert eng.num_unfinished == 0


def test_dead_core_fails_waiting_requests_and_new_ones(tokenizer):
    async def scenario():
        eng = make_engine(tokenizer)
        task = asyncio.create_task(collect(eng, "r1"))
        await asyncio.sleep(0)
        eng._on_dead("the engine core process exited with code -9")
        with pytest.raises(EngineDeadError):
            await task
        with pytest.raises(EngineDeadError):
            await collect(eng, "r2")

    asyncio.run(scenario())


def test_duplicate_request_id_fails_alone_and_aborts_nothing(tokenizer):
    """The second request with a live id is refused at its first iteration; the first one, which
    holds that id, is neither aborted in the core nor disturbed."""
    from fdcli_engine.errors import InvalidRequestError

    async def scenario():
        eng = make_engine(tokenizer)
        first = asyncio.create_task(collect(eng, "r1"))
        await asyncio.sleep(0)
        with pytest.raises(InvalidRequestError, match="already in use"):
            await collect(eng, "r1")
        eng._on_event(OutputsMsg([EngineCoreOutput("r1", [40], finish_reason="length")]))
        return eng, await first

    eng, outs = asyncio.run(scenario())
    assert outs[-1].finished and outs[-1].outputs[0].token_ids == [40]
    assert [m.req_id for m in eng.client.sent if isinstance(m, AddRequest)] == ["r1"]
    assert not [m for m in eng.client.sent if isinstance(m, AbortRequest)]


def test_closing_a_stream_early_aborts_in_core_at_once(tokenizer):
    async def scenario():
        eng = make_engine(tokenizer)
        stream = eng.generate([5, 6, 7], SamplingParams(max_tokens=4), "r1")
        pending = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0)
        eng._on_event(OutputsMsg([EngineCoreOutput("r1", [40])]))
        first = await pending
        await stream.aclose()  # no garbage collection needed: the abort is sent by aclose itself
        return eng, first

    eng, first = asyncio.run(scenario())
    assert not first.finished
    assert [m.req_ids for m in eng.client.sent if isinstance(m, AbortRequest)] == [["r1"]]
    assert eng.num_unfinished == 0
