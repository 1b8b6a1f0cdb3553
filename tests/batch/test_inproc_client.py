"""InProcessEngineClient: greedy outputs equal the offline LLM's, stop strings free the request in the
core, a cancelled caller aborts its request, and a failing step fails the run instead of hanging."""

from __future__ import annotations

import asyncio
import json

import pytest
from batch_helpers import completion_line, write_jsonl
from fake_engine import CharTokenizer

from fdcli_engine.api.async_llm import EngineDeadError
from fdcli_engine.api.inproc_client import InProcessEngineClient
from fdcli_engine.entrypoints.batch import BatchOptions, run_batch
from fdcli_engine.entrypoints.batch.dispatcher import BatchRunError
from fdcli_engine.sampling_params import SamplingParams


async def _collect(client, prompts, params):
    async def one(i, ids):
        last = None
        async for out in client.generate(ids, params, f"r{i}"):
            last = out
        return last

    try:
        return await asyncio.gather(*(one(i, ids) for i, ids in enumerate(prompts)))
    finally:
        await client.shutdown()


def test_concurrent_greedy_outputs_equal_one_at_a_time(shared_core):
    core, tokenizer, config = shared_core
    prompts = [tokenizer.encode(t) for t in ("alpha beta", "gamma", "delta epsilon zeta", "eta")]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    together = asyncio.run(_collect(InProcessEngineClient(config, tokenizer, core=core), prompts, params))
    alone = [
        asyncio.run(_collect(InProcessEngineClient(config, tokenizer, core=core), [p], params))[0]
        for p in prompts
    ]
    assert [o.outputs[0].token_ids for o in together] == [o.outputs[0].token_ids for o in alone]
    assert all(len(o.outputs[0].token_ids) == 12 and o.finished for o in together)


def test_stop_string_and_cancel_free_the_request_in_the_core(shared_core):
    core, tokenizer, config = shared_core
    client = InProcessEngineClient(config, tokenizer, core=core)
    free = core.get_stats()["kv_cache_usage"]

    async def scenario():
        ids = tokenizer.encode("stop here")
        full = None
        async for out in client.generate(
            ids, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True), "a"
        ):
            full = out
        text = full.outputs[0].text
        stop = text[3:5]  # a stop string the model is known to produce after 3+ characters
        cut = None
        params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=[stop])
        async for out in client.generate(ids, params, "b"):
            cut = out
        assert cut.outputs[0].finish_reason == "stop" and cut.outputs[0].text == text[: text.index(stop)]
        # A caller that goes away mid-generation: its request must leave the core too.
        gen = client.generate(ids, SamplingParams(temperature=0, max_tokens=100, ignore_eos=True), "c")
        await gen.__anext__()
        await gen.aclose()
        for _ in range(3):
            await asyncio.sleep(0.01)
        await client.shutdown()

    asyncio.run(scenario())
    assert not core.has_unfinished_requests()
    assert core.get_stats()["kv_cache_usage"] == pytest.approx(free)
    assert client.num_unfinished == 0


class _BrokenCore:
    vocab_size = 256

    def validate_request(self, ids, params):
        pass

    def add_request(self, req):
        self.added = True

    def abort_requests(self, ids):
        return []

    def has_unfinished_requests(self):
        return True

    def step(self):
        raise RuntimeError("kernel exploded")

    def get_stats(self):
        return {}


def test_a_failing_step_fails_the_run_not_hangs(tmp_path, shared_core):
    _, _, config = shared_core
    src = write_jsonl(tmp_path / "in.jsonl", [completion_line(f"x{i}", "hi", 3) for i in range(5)])
    out = tmp_path / "out.jsonl"

    def factory(_):
        engine = InProcessEngineClient(config, CharTokenizer(), core=_BrokenCore())
        engine.model_config.served_model_name = "tiny"
        return engine

    summary_file = tmp_path / "summary.json"
    with pytest.raises(BatchRunError, match="kernel exploded"):
        run_batch(BatchOptions(src, out, progress=False, summary_json=summary_file), {}, factory)
    assert not out.exists()
    summary = json.loads(summary_file.read_text())
    assert summary["status"] == "failed" and "kernel exploded" in summary["message"]

    async def direct():
        client = factory(None)
        with pytest.raises(EngineDeadError):
            async for _ in client.generate([1, 2], SamplingParams(max_tokens=2), "z"):
                pass
        await client.shutdown()

    asyncio.run(direct())


class _PickyCore(_BrokenCore):
    """Accepts validation but refuses the request in add_request (as a core-side check would)."""

    def __init__(self):
        self.requests = []

    def add_request(self, req):
        from fdcli_engine.errors import InvalidRequestError

        if req.req_id == "bad":
            raise InvalidRequestError("refused by the core", "prompt")
        self.requests.append(req.req_id)

    def has_unfinished_requests(self):
        return False


def test_a_request_the_core_refuses_fails_alone(shared_core):
    from fdcli_engine.errors import InvalidRequestError

    _, _, config = shared_core
    core = _PickyCore()
    client = InProcessEngineClient(config, CharTokenizer(), core=core)

    async def scenario():
        with pytest.raises(InvalidRequestError, match="refused by the core"):
            async for _ in client.generate([1, 2], SamplingParams(max_tokens=2), "bad"):
                pass
        gen = client.generate([3], SamplingParams(max_tokens=2), "good")
        task = asyncio.ensure_future(gen.__anext__())
        for _ in range(5):
            await asyncio.sleep(0)
        assert core.requests == ["good"] and not client.is_dead
        task.cancel()
        await client.shutdown()

    asyncio.run(scenario())
