"""OutputCollector (AsyncLLM's per-request queue) folds outputs that pile up while the consumer is busy
into one; the reference is the unmerged stream of the real OutputProcessor."""

from __future__ import annotations

import asyncio

import pytest

from fdcli_engine.api.request_stream import OutputCollector, stream_until_finished
from fdcli_engine.output_processor import OutputProcessor
from fdcli_engine.outputs import EngineCoreOutput
from fdcli_engine.sampling_params import SamplingParams

IDS = [40, 41, 42, 43, 44, 45, 46, 47]


def _outputs(tokenizer, logprobs=None):
    """The processor's outputs for IDS, one token per step, the last one finished."""
    proc = OutputProcessor(tokenizer)
    proc.add_request("r", None, [5, 6], SamplingParams(max_tokens=len(IDS), logprobs=logprobs))
    outs = []
    for k, tid in enumerate(IDS):
        lps = [[(tid, -0.5 - k, 1), (3, -2.0, 2)]] if logprobs is not None else None  # (id, logprob, rank)
        finish = "length" if k == len(IDS) - 1 else None
        outs += proc.process_outputs([EngineCoreOutput("r", [tid], lps, finish_reason=finish)])[0]
    return outs


def test_outputs_that_pile_up_are_merged(tokenizer):
    ref = _outputs(tokenizer, logprobs=1)
    outs = _outputs(tokenizer, logprobs=1)

    async def consume():
        q = OutputCollector()
        for o in outs[:3]:
            q.put_nowait(o)
        first = await q.get()  # three outputs arrived before the consumer looked: one merged output
        for o in outs[3:]:
            q.put_nowait(o)
        return [first] + [item async for item in stream_until_finished(q, lambda: None)]

    got = asyncio.run(consume())
    assert len(got) == 2
    assert [o.outputs[0].delta_text for o in got] == [
        "".join(o.outputs[0].delta_text for o in ref[:3]),
        "".join(o.outputs[0].delta_text for o in ref[3:]),
    ]
    assert [o.outputs[0].delta_token_ids for o in got] == [IDS[:3], IDS[3:]]
    assert got[0].outputs[0].token_ids == IDS[:3] and not got[0].finished
    last = got[1].outputs[0]
    assert got[1].finished and last.finish_reason == "length"
    assert last.text == ref[-1].outputs[0].text == "".join(o.outputs[0].delta_text for o in ref)
    # Cumulative logprobs: the newest output's; the merged delta's entries are its tail.
    assert [list(d) for d in last.logprobs] == [[t, 3] for t in IDS]
    assert [d[IDS[3 + k]].logprob for k, d in enumerate(last.logprobs[-5:])] == [-3.5, -4.5, -5.5, -6.5, -7.5]


def test_an_error_comes_after_the_outputs_before_it(tokenizer):
    outs = _outputs(tokenizer)

    async def consume():
        q = OutputCollector()
        q.put_nowait(outs[0])
        q.put_nowait(outs[1])
        q.put_nowait(RuntimeError("core died"))
        q.put_nowait(outs[2])  # after the error: dropped
        got = []
        with pytest.raises(RuntimeError, match="core died"):
            async for item in stream_until_finished(q, lambda: got.append("aborted")):
                got.append(item)
        return got

    got = asyncio.run(consume())
    assert len(got) == 1 and got[0].outputs[0].delta_token_ids == IDS[:2]  # no abort: the error ended it


def test_a_waiting_consumer_gets_each_output_alone(tokenizer):
    outs = _outputs(tokenizer)

    async def consume():
        q = OutputCollector()
        got = []

        async def reader():
            async for item in stream_until_finished(q, lambda: None):
                got.append(item)

        task = asyncio.create_task(reader())
        for o in outs:
            await asyncio.sleep(0)  # the reader is waiting each time an output arrives
            q.put_nowait(o)
        await task
        return got

    got = asyncio.run(consume())
    assert [o.outputs[0].delta_token_ids for o in got] == [[t] for t in IDS]


def test_delta_outputs_that_pile_up_are_joined(tokenizer):
    from fdcli_engine.sampling_params import RequestOutputKind

    proc = OutputProcessor(tokenizer)
    params = SamplingParams(max_tokens=len(IDS), logprobs=1, output_kind=RequestOutputKind.DELTA)
    proc.add_request("r", None, [5, 6], params)
    outs = []
    for k, tid in enumerate(IDS):
        finish = "length" if k == len(IDS) - 1 else None
        core = EngineCoreOutput("r", [tid], [[(tid, -0.5 - k, 1), (3, -2.0, 2)]], finish_reason=finish)
        outs += proc.process_outputs([core])[0]
    texts = [o.outputs[0].text for o in outs]

    async def consume():
        q = OutputCollector(RequestOutputKind.DELTA)
        for o in outs[:3]:
            q.put_nowait(o)
        first = await q.get()
        for o in outs[3:]:
            q.put_nowait(o)
        return [first] + [item async for item in stream_until_finished(q, lambda: None)]

    got = asyncio.run(consume())
    assert [o.outputs[0].text for o in got] == ["".join(texts[:3]), "".join(texts[3:])]
    assert [o.outputs[0].token_ids for o in got] == [IDS[:3], IDS[3:]]
    assert [o.outputs[0].delta_token_ids for o in got] == [IDS[:3], IDS[3:]]
    assert [[next(iter(d)) for d in o.outputs[0].logprobs] for o in got] == [IDS[:3], IDS[3:]]
    assert got[1].finished


def test_a_cancelled_wait_loses_nothing(tokenizer):
    """A consumer cancelled while it waits (client gone, timeout) leaves the collector usable: the next
    output goes to the next wait, not to the cancelled one."""
    outs = _outputs(tokenizer)

    async def consume():
        q = OutputCollector()
        waiting = asyncio.ensure_future(q.get())
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        q.put_nowait(outs[0])
        return await asyncio.wait_for(q.get(), 5)

    got = asyncio.run(consume())
    assert got.outputs[0].token_ids == outs[0].outputs[0].token_ids
    assert got.outputs[0].text == outs[0].outputs[0].text
