"""A streamed response's body whose first item is already being produced when the response starts.

A serving generator sends its request to the engine at its first iteration. Starting that iteration
as a task as soon as the generator exists puts the request in the engine before the framework writes
the response headers, so the engine's step and the HTTP work overlap instead of following each other.
The bytes on the wire are the same: the items are those of the generator, in order.

Invariant: however the response ends (never started, client gone, cancelled, error), `aclose()`
leaves the generator finished, its `finally` run (so its requests are aborted in the engine): the
pending first iteration is cancelled and awaited before the generator is closed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator


class PrimedStream:
    def __init__(self, gen: AsyncGenerator):
        self._gen = gen
        self._first: asyncio.Task | None = asyncio.ensure_future(gen.__anext__())

    def __aiter__(self) -> PrimedStream:
        return self

    def __anext__(self):
        """An awaitable of the next item: the first iteration's task, then the generator's own
        `__anext__()` (no coroutine of ours around each later item, which the stream pays per token).
        Cancelling the await of the task cancels the task (and so the generator)."""
        first, self._first = self._first, None
        if first is not None:
            return first
        return self._gen.__anext__()

    async def aclose(self) -> None:
        first, self._first = self._first, None
        if first is not None and not first.done():
            first.cancel()
            await asyncio.wait({first})  # never raises the task's outcome, only our own cancellation
        if first is not None and first.done() and not first.cancelled():
            first.exception()  # retrieved: an item or error nobody will read is not logged as lost
        await self._gen.aclose()
