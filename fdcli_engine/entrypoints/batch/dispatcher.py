"""The batch dispatcher: input lines → the OpenAI serving layer (the same classes `fd serve` routes to) →
output records in input order.

Flow invariants:
- Lines are read lazily. A line starts only when fewer than `window` requests are in flight (the
  engine's queue stays full but bounded) and its sequence number is within `reorder_limit` of the next
  one to write, so the reorder buffer never holds more than `reorder_limit` records however slow one
  request is. The reorder limit is larger than the window so one long request at the head does not
  starve the batch of work until it reaches the limit.
- A line's failure is an error record, never an exception out of the run; only a dead engine or an
  I/O error fails the run. With `strict`, the first error record written (the first bad line in input
  order) stops the run.
- A line is answered once. A line whose data-parallel rank died under it (the other ranks live on)
  runs again, on a live rank, by line_retry's rule (the Ray actors' too): a line that has seen two
  ranks die gets a `rank_died` error record.
- The body is parsed by the request model of its route (openai/routes.py, the table `fd serve` maps
  onto HTTP) and executed by the same serving layer; a rejection is the same status and error object
  the server would send.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from pydantic import ValidationError

from fdcli_engine.entrypoints.batch.files import OutputWriter, iter_lines
from fdcli_engine.entrypoints.batch.line_retry import gave_up
from fdcli_engine.entrypoints.batch.records import (
    BatchLine,
    LineError,
    dump_record,
    error_record,
    line_key,
    parse_line,
    success_record,
)
from fdcli_engine.entrypoints.batch.summary import BatchSummary
from fdcli_engine.entrypoints.openai.errors import bad_request, from_exception
from fdcli_engine.entrypoints.openai.routes import BATCH_ROUTES, Route
from fdcli_engine.entrypoints.openai.serving_layer import ServingLayer
from fdcli_engine.entrypoints.openai.validation import validation_error
from fdcli_engine.errors import FdError
from fdcli_engine.pooling.encoding import PoolingBytes

logger = logging.getLogger("fd.batch")


class BatchRunError(FdError):
    """The run itself failed (the engine died); results written so far stay in OUT.partial."""


class RankDiedError(FdError):
    """The data-parallel rank running a line died; the engine's other ranks live on."""


class StrictStop(FdError):
    """--strict: a line failed; the run stopped after writing its error record."""


def _usage_tokens(body: dict) -> tuple[int, int]:
    usage = body.get("usage") or {}
    return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)


async def serve_line(serving: ServingLayer, routes: dict[str, Route], line: BatchLine) -> dict:
    """One parsed line through the serving layer: its success or error record (a rejection carries the
    status and error object `fd serve` would answer). BatchRunError when the engine is dead,
    RankDiedError when only the line's data-parallel rank is."""
    from fdcli_engine.api.protocol import EngineDeadError

    route = routes[line.url]
    try:
        req = route.request_model.model_validate(line.body)
        resp = await route.call(serving, req)
        if isinstance(resp, PoolingBytes):  # a binary body: an output line is JSON
            raise bad_request(
                f"encoding_format {req.encoding_format!r} has no JSON form for a batch output line: use base64",
                "encoding_format",
            )
    except Exception as e:
        # The record's code is the server's for the same body: its error code, else its type.
        err = validation_error(e.errors()) if isinstance(e, ValidationError) else from_exception(e)
        if serving.engine.is_dead:
            raise BatchRunError(f"the engine failed at line {line.line_no}: {err.message}") from None
        if isinstance(e, EngineDeadError) or isinstance(e.__cause__, EngineDeadError):
            raise RankDiedError(err.message) from None
        if err.status >= 500:
            logger.error("line %d (%s) failed: %s: %s", line.line_no, line.custom_id, type(e).__name__, e)
        code = err.code or err.type
        return error_record(line.line_no, line.custom_id, code, err.message, err.status, err.to_dict())
    body = resp.model_dump(mode="json")
    return success_record(line.custom_id, str(body.get("id", "")), body)


class BatchDispatcher:
    def __init__(
        self,
        serving: ServingLayer,
        writer: OutputWriter,
        window: int,
        *,
        reorder_limit: int | None = None,
        done_keys: dict | None = None,
        strict: bool = False,
        progress=None,
        routes: dict[str, Route] | None = None,
    ):
        self.serving = serving
        self.writer = writer
        self.window = max(1, window)
        self.reorder_limit = max(self.window, reorder_limit or 8 * self.window)
        self.max_inflight_seen = 0  # observability for tests: the bounds held
        self.max_buffered_seen = 0
        self._inflight = 0
        self.done_keys = done_keys or {}  # key -> whether its earlier record succeeded
        self.strict = strict
        self.progress = progress
        self.routes = routes or BATCH_ROUTES
        self.summary = BatchSummary()
        self._buffer: dict[int, tuple[str, dict]] = {}  # seq -> (output line, record)
        self._next_write = 0
        self._room = asyncio.Condition()
        self._tasks: set[asyncio.Task] = set()
        self._stop: BaseException | None = None

    async def run(self, path: Path) -> BatchSummary:
        seq = 0
        try:
            for line_no, raw in iter_lines(path):
                if self._stop is not None:
                    break
                if line_no % 256 == 0:
                    await asyncio.sleep(0)  # long runs of skipped/bad lines must not starve the engine
                try:
                    line = parse_line(line_no, raw, self.routes)
                except LineError as e:
                    if line_key(line_no, e.custom_id) in self.done_keys:
                        self._skip(line_key(line_no, e.custom_id))
                        continue
                    await self._wait_for_room(seq, needs_slot=False)
                    self._finish(seq, error_record(line_no, e.custom_id, e.code, e.message))
                    seq += 1
                    continue
                if line_key(line_no, line.custom_id) in self.done_keys:
                    self._skip(line_key(line_no, line.custom_id))
                    continue
                await self._wait_for_room(seq)
                if self._stop is not None:
                    break
                self._inflight += 1
                self.max_inflight_seen = max(self.max_inflight_seen, self._inflight)
                task = asyncio.create_task(self._execute(seq, line))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                seq += 1
            while self._tasks and self._stop is None:
                await asyncio.wait(set(self._tasks), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in list(self._tasks):
                t.cancel()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            self.writer.flush()
        if self._stop is not None:
            raise self._stop
        return self.summary

    def _skip(self, key) -> None:
        self.summary.skipped += 1
        if not self.done_keys[key]:
            self.summary.skipped_failed += 1
        if self.progress is not None:
            self.progress.advance(self.summary)

    async def _wait_for_room(self, seq: int, needs_slot: bool = True) -> None:
        """Until `seq` fits the reorder buffer and (for a request) an in-flight slot is free."""

        def room() -> bool:
            if self._stop is not None:
                return True
            slot = not needs_slot or self._inflight < self.window
            return slot and seq - self._next_write < self.reorder_limit

        async with self._room:
            await self._room.wait_for(room)

    async def _execute(self, seq: int, line: BatchLine) -> None:
        try:
            record = await self._serve(line)
        except BatchRunError as e:
            self._stop = e
        else:
            self._finish(seq, record)
        finally:
            # Decrement before notifying: the reader's room predicate reads this counter.
            self._inflight -= 1
        await self._notify()

    async def _notify(self) -> None:
        async with self._room:
            self._room.notify_all()

    async def _serve(self, line: BatchLine) -> dict:
        """The line's record, run again on a live rank while line_retry allows when its data-parallel
        rank dies; BatchRunError when the engine is gone (the Ray dispatcher overrides this)."""
        attempts = 0
        while True:
            try:
                return await serve_line(self.serving, self.routes, line)
            except RankDiedError as e:
                attempts += 1
                record = gave_up(line, attempts, "data-parallel ranks", "rank_died", str(e))
                if record is not None:
                    return record
                self.summary.retried += 1

    def _finish(self, seq: int, record: dict) -> None:
        """Buffer one record and write every record that is now next in input order."""
        self._buffer[seq] = (dump_record(record), record)
        self.max_buffered_seen = max(self.max_buffered_seen, len(self._buffer))
        wrote = False
        while self._next_write in self._buffer and self._stop is None:
            text, rec = self._buffer.pop(self._next_write)
            self.writer.write(text)
            self._next_write += 1
            wrote = True
            self._count(rec)
            if rec["error"] is not None and self.strict:
                err = rec["error"]
                self._stop = StrictStop(f"line {err['line']} failed (--strict): {err['message']}")
        if wrote:
            self.writer.flush()
        if self._stop is not None:
            self._buffer.clear()

    def _count(self, record: dict) -> None:
        s = self.summary
        if record["error"] is None:
            s.succeeded += 1
            prompt, completion = _usage_tokens(record["response"]["body"])
            s.prompt_tokens += prompt
            s.completion_tokens += completion
        else:
            s.failed += 1
        if self.progress is not None:
            self.progress.advance(s)
