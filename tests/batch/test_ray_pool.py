"""The Ray actor pool without Ray: fake actor handles that answer, fail or stall, under the real batch
dispatcher. A failed actor's lines are retried once on another, then failed per line; a slow actor holds
no more than its calls' lines; the output stays in input order with every line once. And the plan of
how many actors of how many CPUs a cluster takes (`plan_actors`)."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from batch_helpers import completion_line, read_jsonl, write_jsonl

from fdcli_engine.entrypoints.batch.dispatcher import BatchRunError
from fdcli_engine.entrypoints.batch.files import OutputWriter, partial_path
from fdcli_engine.entrypoints.batch.ray_driver import plan_actors
from fdcli_engine.entrypoints.batch.ray_pool import RayActor, RayActorPool, RayDispatcher
from fdcli_engine.entrypoints.batch.records import dump_record, success_record
from fdcli_engine.errors import ConfigError


class _Method:
    def __init__(self, fn):
        self.remote = fn


class FakeActor:
    """`handle.run_lines.remote(lines_json)` as Ray's handle has it; `mode` says what a call does."""

    def __init__(self, name: str, mode: str = "answer", fail_after: int = 0):
        self.name, self.mode, self.fail_after = name, mode, fail_after
        self.calls = 0
        self.held: list[str] = []  # custom_ids of the lines of every call made to this actor
        self.release = asyncio.Event()
        self.run_lines = _Method(self._run_lines)

    async def _run_lines(self, lines_json: str) -> list[str]:
        items = json.loads(lines_json)
        self.calls += 1
        self.held += [cid for _, cid, _, _ in items]
        await asyncio.sleep(0)
        if self.mode == "die" and self.calls > self.fail_after:
            raise RuntimeError(f"{self.name} died")
        if self.mode == "stall":
            await self.release.wait()
        body = {"usage": {"prompt_tokens": 1, "completion_tokens": 1}, "by": self.name}
        return [dump_record(success_record(cid, "req", body)) for _, cid, _, _ in items]


def _pool(actors: list[FakeActor], chunk: int = 2, kills: list | None = None) -> RayActorPool:
    wrapped = [RayActor(i, a, 1000 + i, "host") for i, a in enumerate(actors)]
    killed = kills if kills is not None else []
    return RayActorPool(wrapped, chunk=chunk, kill=lambda h, no_restart: killed.append(h.name))


async def _run(tmp_path, pool: RayActorPool, num: int, window: int = 8):
    src = write_jsonl(tmp_path / "in.jsonl", [completion_line(f"id-{i}", "p") for i in range(num)])
    out = tmp_path / "out.jsonl"
    partial_path(out).write_bytes(b"")
    writer = OutputWriter(out)
    pool.start()
    try:
        dispatcher = RayDispatcher(pool, writer, window)
        try:
            await dispatcher.run(src)
        finally:
            writer.close()
    finally:
        await pool.close()
    return dispatcher.summary, read_jsonl(partial_path(out))


def test_a_failed_actors_lines_are_answered_once_by_the_other(tmp_path):
    dead, live = FakeActor("a", "die", fail_after=1), FakeActor("b")
    kills: list = []
    pool = _pool([dead, live], kills=kills)
    summary, records = asyncio.run(_run(tmp_path, pool, 20))
    assert [r["custom_id"] for r in records] == [f"id-{i}" for i in range(20)]  # input order, each once
    assert summary.succeeded == 20 and summary.failed == 0
    by_a = {r["custom_id"] for r in records if r["response"]["body"]["by"] == "a"}
    lost = set(dead.held) - by_a  # the lines of the calls that failed
    assert lost and pool.retried == len(lost)
    assert lost <= set(live.held)  # retried on the other actor
    assert kills == ["a"]  # taken out of the pool once, however many of its calls failed


def test_a_line_whose_second_actor_fails_too_is_an_error_record_then_the_run_fails(tmp_path):
    a, b = FakeActor("a", "die"), FakeActor("b", "die")
    kills: list = []
    pool = _pool([a, b], kills=kills)
    with pytest.raises(BatchRunError, match="every Ray actor has failed"):
        asyncio.run(_run(tmp_path, pool, 3, window=1))  # one line at a time: each step is determined
    # id-0 failed on one actor, was retried on the other (never on the same one), failed again.
    assert sorted(a.held + b.held) == ["id-0", "id-0"] and sorted(kills) == ["a", "b"]
    records = read_jsonl(partial_path(tmp_path / "out.jsonl"))
    assert [r["custom_id"] for r in records] == ["id-0"]  # id-1 and id-2 are left for --resume
    assert records[0]["error"]["code"] == "actor_died"
    assert "failed 2 times" in records[0]["error"]["message"] and "died" in records[0]["error"]["message"]


def test_a_stalled_actor_holds_only_its_calls_lines(tmp_path):
    slow, fast = FakeActor("slow", "stall"), FakeActor("fast")

    async def main():
        pool = _pool([slow, fast], chunk=2)
        task = asyncio.create_task(_run(tmp_path, pool, 30, window=12))
        while len(fast.held) < 30 - 4:  # everything but the stalled actor's two calls of two lines
            await asyncio.sleep(0.001)
        assert len(slow.held) == 4  # it pulled nothing more while stalled
        slow.release.set()
        return await task

    summary, records = asyncio.run(asyncio.wait_for(main(), 60))  # a guard against a hang only
    assert [r["custom_id"] for r in records] == [f"id-{i}" for i in range(30)]
    assert summary.succeeded == 30


@pytest.mark.parametrize(
    "node_cpus, threads, actors, want",
    [
        ([2], 1, None, (1, 2)),  # the test cluster: 2 actors of 1 CPU
        ([16, 16], None, None, (16, 2)),  # no --threads: one engine per machine
        ([16, 8], None, None, (8, 3)),  # the smallest node's CPUs each
        ([16, 16], None, 4, (8, 4)),  # --data-parallel-size alone splits the cluster's CPUs
        ([16, 16], 4, None, (4, 8)),
        ([16, 0], 2, 3, (2, 3)),  # a node without CPUs takes no actor
    ],
)
def test_actor_plan(node_cpus, threads, actors, want):
    assert plan_actors(node_cpus, threads, actors) == want


@pytest.mark.parametrize(
    "node_cpus, threads, actors, message",
    [
        ([2], 1, 3, "3 Ray actor(s) of 1 CPU(s) each"),
        ([8, 8], 12, None, "at most 8 on one node"),
        ([0], None, None, "no CPUs"),
    ],
)
def test_actor_plans_that_do_not_fit_are_one_clear_error(node_cpus, threads, actors, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        plan_actors(node_cpus, threads, actors)
