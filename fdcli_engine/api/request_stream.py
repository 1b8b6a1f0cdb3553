"""The consumer side of one request's output queue, used by the engine front end (front_end.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from fdcli_engine.outputs import RequestOutput
from fdcli_engine.sampling_params import RequestOutputKind


async def stream_until_finished(
    q: asyncio.Queue, abort: Callable[[], None], open_request: Callable[[], None] | None = None
) -> AsyncIterator[RequestOutput]:
    """Yield a request's outputs until one is finished. `open_request` (when given) runs at the first
    iteration, before anything can be aborted: a request that fails to open raises there and aborts
    nothing (its id may be another live request's). An exception put on the queue (the engine refused
    or failed the request, or died) is raised and needs no abort. A consumer that stops early (client
    disconnect, cancellation) aborts the request, so its KV blocks are freed: close this generator
    promptly (`contextlib.aclosing`) for the abort to happen at once."""
    if open_request is not None:
        open_request()
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


class OutputCollector:
    """One request's output queue (the `get`/`put_nowait` of asyncio.Queue) that merges: outputs that
    arrive while the consumer is busy are folded into one, so a consumer that falls behind (a loaded
    machine, a slow client) writes one chunk for several tokens instead of one per token and catches up.

    Merged output, by the request's output kind: CUMULATIVE, the newest one (its cumulative text, token
    ids, logprobs, finish) with the delta text and delta token ids of every output folded into it, in
    order; DELTA, the newest one with the text, token ids and logprobs of every output joined in order.
    FINAL_ONLY and pooling requests have one output: nothing to fold. An exception is delivered after
    the outputs that came before it; outputs after an exception are dropped (the stream ends there)."""

    def __init__(self, output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE) -> None:
        self._merge = _merge_delta if output_kind is RequestOutputKind.DELTA else _merge_cumulative
        self._output: RequestOutput | None = None
        self._error: BaseException | None = None
        # The consumer's pending wait, if any: one future per wait, woken directly (an asyncio.Event
        # would add its waiter list and a coroutine per streamed token).
        self._waiter: asyncio.Future | None = None

    def put_nowait(self, item: RequestOutput | BaseException) -> None:
        if self._error is not None:
            return
        if isinstance(item, BaseException):
            self._error = item
        elif self._output is None:
            self._output = item
        else:
            self._output = self._merge(self._output, item)
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> RequestOutput | BaseException:
        while self._output is None and self._error is None:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                if self._waiter is waiter:  # cancelled: a later put must not wake a stale future
                    self._waiter = None
        if self._output is not None:
            out, self._output = self._output, None
            return out
        err, self._error = self._error, None
        return err


def _merge_cumulative(old: RequestOutput, new: RequestOutput) -> RequestOutput:
    if not old.outputs or not new.outputs:  # pooling outputs come once; nothing to fold
        return new
    a, b = old.outputs[0], new.outputs[0]
    b.delta_text = a.delta_text + b.delta_text
    b.delta_token_ids = list(a.delta_token_ids) + list(b.delta_token_ids)
    return new


def _merge_delta(old: RequestOutput, new: RequestOutput) -> RequestOutput:
    a, b = old.outputs[0], new.outputs[0]
    b.text = b.delta_text = a.text + b.text
    b.token_ids = b.delta_token_ids = a.token_ids + b.token_ids
    if a.logprobs is not None and b.logprobs is not None:
        b.logprobs = a.logprobs + b.logprobs
    if new.prompt_logprobs is None:  # they come once, in the first output
        new.prompt_logprobs = old.prompt_logprobs
    return new
