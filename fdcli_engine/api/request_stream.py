"""The consumer side of one request's output queue, shared by the engine clients (AsyncLLM over the
engine-core process, InProcessEngineClient in-process)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from fdcli_engine.outputs import RequestOutput


async def stream_until_finished(q: asyncio.Queue, abort: Callable[[], None]) -> AsyncIterator[RequestOutput]:
    """Yield a request's outputs until one is finished. An exception put on the queue (the engine
    refused or failed the request, or died) is raised and needs no abort. A consumer that stops early
    (client disconnect, cancellation) aborts the request, so its KV blocks are freed: close this
    generator promptly (`contextlib.aclosing`) for the abort to happen at once."""
    finished = False
    try:
        while True:
            item = await q.get()
            if isinstance(item, BaseException):
                finished = True
                raise item
            finished = item.finished
            yield item
            if finished:
                return
    finally:
        if not finished:
            abort()
