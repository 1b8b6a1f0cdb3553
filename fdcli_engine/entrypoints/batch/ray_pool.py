"""The driver's side of the Ray actors: a work queue of lines that every live actor pulls from, and the
dispatcher that sends its lines there instead of to a local engine.

Invariants:
- Work queue, not static shards: each actor has at most `calls_per_actor` calls in flight, each of at
  most `chunk` lines, and pulls the next lines only when a call returns, so a slow actor holds no
  more than that while the others drain the queue.
- A line is answered once. When an actor fails (its process died, or its engine did), the lines of its
  unanswered calls go back to the front of the queue for the live actors; a line whose second actor
  fails too gets an `actor_died` error record (line_retry.py, the data-parallel run's rule too). With
  no live actor left the run fails (BatchRunError): OUT.partial keeps what was written and `--resume`
  runs the rest.
- Everything else (input order, the reorder bound, --resume skipping, line errors, --strict, the
  summary) is the BatchDispatcher's, unchanged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections import deque
from dataclasses import dataclass

from fdcli_engine.entrypoints.batch.dispatcher import BatchDispatcher, BatchRunError
from fdcli_engine.entrypoints.batch.line_retry import gave_up
from fdcli_engine.entrypoints.batch.ray_actor import encode_lines
from fdcli_engine.entrypoints.batch.records import BatchLine

logger = logging.getLogger("fd.batch")


@dataclass
class _Job:
    line: BatchLine
    future: asyncio.Future
    attempts: int = 0  # actors that failed while holding this line


@dataclass
class RayActor:
    index: int
    handle: object  # a Ray ActorHandle of BatchEngineActor
    pid: int
    host: str


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text[:300]


class RayActorPool:
    def __init__(self, actors: list[RayActor], chunk: int, calls_per_actor: int = 2, kill=None):
        self.actors = actors
        self.chunk = max(1, chunk)
        self.calls_per_actor = max(1, calls_per_actor)
        self._kill = kill  # ray.kill, injected so that this module does not import Ray
        self._alive = {a.index for a in actors}
        self._queue: deque[_Job] = deque()
        self._changed = asyncio.Condition()
        self._workers: list[asyncio.Task] = []
        self.retried = 0  # lines put back on the queue after an actor failed (observability)
        self.answered = {a.index: 0 for a in actors}  # lines each actor answered

    def start(self) -> None:
        # Round-robin: the first calls of every actor are made before the second call of any.
        for _ in range(self.calls_per_actor):
            for actor in self.actors:
                self._workers.append(asyncio.create_task(self._worker(actor)))

    def report(self) -> str:
        counts = ", ".join(f"{i}: {n}" for i, n in self.answered.items())
        return f"fd run-batch: lines answered per Ray actor: {counts} ({self.retried} retried)"

    async def close(self) -> None:
        for w in self._workers:
            w.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)

    async def serve(self, line: BatchLine) -> dict:
        """The line's record, from whichever actor takes it."""
        if not self._alive:
            raise BatchRunError("every Ray actor has failed; rerun with --resume")
        job = _Job(line, asyncio.get_running_loop().create_future())
        self._queue.append(job)
        await self._notify()
        return await job.future

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _take(self, actor: RayActor) -> list[_Job] | None:
        """The next lines for `actor`, or None once it has failed."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._queue or actor.index not in self._alive)
            if actor.index not in self._alive:
                return None
            return [self._queue.popleft() for _ in range(min(self.chunk, len(self._queue)))]

    async def _worker(self, actor: RayActor) -> None:
        while True:
            jobs = await self._take(actor)
            if jobs is None:
                return
            items = [(j.line.line_no, j.line.custom_id, j.line.url, j.line.body) for j in jobs]
            try:
                texts = await actor.handle.run_lines.remote(encode_lines(items))
            except asyncio.CancelledError:
                raise
            except Exception as e:  # RayActorError (the process died) or RayTaskError (its engine did)
                await self._actor_failed(actor, e, jobs)
                return
            self.answered[actor.index] += len(jobs)
            for job, text in zip(jobs, texts):
                if not job.future.done():
                    job.future.set_result(json.loads(text))

    async def _actor_failed(self, actor: RayActor, error: BaseException, jobs: list[_Job]) -> None:
        """Take `actor` out of the pool and send its unanswered lines elsewhere (or fail them)."""
        if actor.index in self._alive:
            self._alive.discard(actor.index)
            reason = _one_line(error)
            sys.stderr.write(
                f"fd run-batch: Ray actor {actor.index} (pid {actor.pid} on {actor.host}) failed; its "
                f"unfinished lines are retried on the other actors: {reason}\n"
            )
            if self._kill is not None:  # a live process whose engine died still holds its CPUs
                try:
                    self._kill(actor.handle, no_restart=True)
                except Exception:  # already gone
                    pass
        reason = _one_line(error)
        for job in reversed(jobs):  # to the front of the queue, in their order: they are the oldest
            job.attempts += 1
            if job.future.done():
                continue
            record = gave_up(job.line, job.attempts, "Ray actors", "actor_died", reason)
            if record is not None:
                job.future.set_result(record)
            else:
                self.retried += 1
                self._queue.appendleft(job)
        if not self._alive:  # nowhere to retry: the run fails, and --resume takes it from OUT.partial
            self._fail_queued(
                BatchRunError(f"every Ray actor has failed; rerun with --resume (last: {reason})")
            )
        await self._notify()

    def _fail_queued(self, error: BatchRunError) -> None:
        pending = list(self._queue)
        self._queue.clear()
        for job in pending:
            if not job.future.done():
                job.future.set_exception(error)


class RayDispatcher(BatchDispatcher):
    """The batch dispatcher with the Ray actors in place of the local serving layer."""

    def __init__(self, pool: RayActorPool, writer, window: int, **kw):
        super().__init__(None, writer, window, **kw)
        self.pool = pool

    async def _serve(self, line: BatchLine) -> dict:
        record = await self.pool.serve(line)
        self.summary.retried = self.pool.retried
        return record
