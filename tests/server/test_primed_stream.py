"""PrimedStream: the generator's items in order, its first iteration started at once, and its `finally`
(the engine abort) run however the stream ends."""

from __future__ import annotations

import asyncio
import gc

import pytest

from fdcli_engine.entrypoints.openai.primed_stream import PrimedStream


def _gen(log: list, items, gate: asyncio.Event | None = None, fail: Exception | None = None):
    async def gen():
        log.append("opened")
        try:
            if gate is not None:
                await gate.wait()
            for item in items:
                yield item
            if fail is not None:
                raise fail
        finally:
            log.append("finally")

    return gen()


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, 5))


def test_items_in_order_and_first_iteration_starts_before_any_read():
    async def main():
        log: list = []
        stream = PrimedStream(_gen(log, ["a", "b", "c"]))
        await asyncio.sleep(0)
        assert log == ["opened"]  # the request is sent before the response asks for its first item
        out = [item async for item in stream]
        await stream.aclose()
        return out, log

    assert _run(main()) == (["a", "b", "c"], ["opened", "finally"])


def test_error_in_the_first_item_reaches_the_reader():
    async def main():
        stream = PrimedStream(_gen([], [], fail=ValueError("boom")))
        with pytest.raises(ValueError, match="boom"):
            await stream.__anext__()
        await stream.aclose()

    _run(main())


@pytest.mark.parametrize("yield_first", [False, True])
def test_close_before_any_read_cancels_and_finishes_the_generator(yield_first, caplog):
    async def main():
        log: list = []
        gate = asyncio.Event()
        stream = PrimedStream(_gen(log, ["a"], gate))
        if yield_first:
            await asyncio.sleep(0)  # the first iteration is now waiting on the engine
        await stream.aclose()
        assert log == (["opened", "finally"] if yield_first else [])
        gate.set()
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()

    _run(main())
    gc.collect()
    assert "never retrieved" not in caplog.text


def test_close_after_the_first_item_was_produced_but_not_read(caplog):
    async def main():
        log: list = []
        stream = PrimedStream(_gen(log, ["a", "b"], fail=ValueError("unread")))
        await asyncio.sleep(0.01)
        await stream.aclose()
        assert log == ["opened", "finally"]

    _run(main())
    gc.collect()
    assert "never retrieved" not in caplog.text


def test_cancelled_reader_cancels_the_generator():
    async def main():
        log: list = []
        gate = asyncio.Event()
        stream = PrimedStream(_gen(log, ["a"], gate))
        reader = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0.01)
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        await stream.aclose()
        assert log == ["opened", "finally"]

    _run(main())
