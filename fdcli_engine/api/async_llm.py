"""AsyncLLM: the server's engine client. Tokenizes nothing itself; it routes requests to the engine-core
process and detokenized outputs back to per-request queues.

It implements the `EngineClient` protocol the serving layer depends on: `generate`, `abort`,
`tokenizer`, `model_config`, `is_ready`, `get_stats`. Invariants: every request id has at most one
queue; a request that ends without a finished output (client gone, task cancelled, error) is aborted in
the core, so its KV blocks are freed within a step or two; when the core dies every waiting request
gets EngineDeadError at once instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fdcli_engine.api.core_client import DEFAULT_CORE, CoreClient
from fdcli_engine.api.core_messages import (
    AbortRequest,
    AddRequest,
    FatalMsg,
    OutputsMsg,
    ReadyMsg,
    RequestFailed,
    UtilityReply,
    UtilityRequest,
)
from fdcli_engine.api.request_stream import OutputCollector, stream_until_finished
from fdcli_engine.errors import FdError, InvalidRequestError
from fdcli_engine.outputs import CompletionOutput, RequestOutput
from fdcli_engine.resolved_config import ResolvedConfig
from fdcli_engine.sampling_params import SamplingParams

logger = logging.getLogger("fd.serve")


class EngineDeadError(FdError):
    """The engine-core process is gone; nothing more can be generated."""


class EngineNotReadyError(FdError):
    """The engine core is still loading the model."""


class EngineRequestError(FdError):
    """The core failed one request for a reason that is not the client's fault."""


@dataclass
class ModelConfig:
    model: str
    served_model_name: str
    max_model_len: int
    vocab_size: int = 0


def _pooling_output(out) -> RequestOutput:
    comp = CompletionOutput(0, "", [], finish_reason=out.finish_reason, stop_reason=out.stop_reason)
    ro = RequestOutput(out.req_id, None, [], [comp], out.finish_reason is not None, out.num_cached_tokens)
    ro.pooled = getattr(out, "pooled", None)  # read by the pooling serving layer
    return ro


def _default_output_processor_cls():
    from fdcli_engine.output_processor import OutputProcessor

    return OutputProcessor


class AsyncLLM:
    def __init__(
        self,
        config: ResolvedConfig,
        tokenizer,
        served_model_name: str | None = None,
        output_processor_cls=None,
        core_spec: str = DEFAULT_CORE,
        core_stdout: int | None = None,
    ):
        self.config = config
        self.tokenizer = tokenizer
        name = served_model_name or config.served_model_name or str(config.model or "fd-model")
        self.model_config = ModelConfig(str(config.model), name, int(config.max_model_len or 0))
        self.output_processor = (output_processor_cls or _default_output_processor_cls())(tokenizer)
        self._queues: dict[str, OutputCollector] = {}
        self._pooling: set[str] = set()  # pooling requests bypass the output processor
        self._pending_calls: dict[int, asyncio.Future] = {}
        self._call_ids = itertools.count()
        self.is_ready = False
        self.was_ready = False  # stays True after a death: tells "died while serving" from "never started"
        self.dead_reason: str | None = None
        self.ready_event = asyncio.Event()
        self.client = CoreClient(config, self._on_event, self._on_dead, core_spec, core_stdout)

    @property
    def is_dead(self) -> bool:
        return self.dead_reason is not None

    @property
    def core_pid(self) -> int | None:
        return self.client.pid

    @property
    def num_unfinished(self) -> int:
        return len(self._queues)

    async def start(self) -> None:
        self.client.start()

    # ---- events from the core (run on the event loop, must not block) ----
    def _on_event(self, event) -> None:
        if isinstance(event, OutputsMsg):
            self._route_outputs(event.outputs)
        elif isinstance(event, RequestFailed):
            err: Exception = (
                InvalidRequestError(event.message, event.param)
                if event.status == 400
                else EngineRequestError(event.message)
            )
            self.output_processor.abort(event.req_id)
            self._put(event.req_id, err)
        elif isinstance(event, UtilityReply):
            fut = self._pending_calls.pop(event.call_id, None)
            if fut and not fut.done():
                fut.set_result(event)
        elif isinstance(event, ReadyMsg):
            if event.max_model_len:
                self.model_config.max_model_len = event.max_model_len
            self.model_config.vocab_size = event.vocab_size
            self.is_ready = self.was_ready = True
            self.ready_event.set()
        elif isinstance(event, FatalMsg):
            self._on_dead(f"the engine core failed to start: {event.message}")

    def _route_outputs(self, outputs) -> None:
        # Outputs of requests the front end already dropped (aborted) are ignored.
        known = [o for o in outputs if o.req_id in self._queues]
        if self._pooling:
            for o in [o for o in known if o.req_id in self._pooling]:
                self._put(o.req_id, _pooling_output(o))
            known = [o for o in known if o.req_id not in self._pooling]
        if not known:
            return
        try:
            request_outputs, to_abort = self.output_processor.process_outputs(known)
        except Exception:
            # Some request's output broke detokenization: redo them one by one so only it fails.
            request_outputs, to_abort = self._route_one_by_one(known)
        for ro in request_outputs:
            self._put(ro.request_id, ro)
        if to_abort:  # stop strings matched (or a request failed): free it in the core
            self.client.send(AbortRequest(list(to_abort)))

    def _route_one_by_one(self, outputs) -> tuple[list, list[str]]:
        request_outputs, to_abort = [], []
        for out in outputs:
            try:
                ros, aborts = self.output_processor.process_outputs([out])
            except Exception as e:
                logger.exception("processing the output of %s failed", out.req_id)
                self.output_processor.abort(out.req_id)
                self._put(out.req_id, EngineRequestError(f"{type(e).__name__} while detokenizing"))
                to_abort.append(out.req_id)
                continue
            request_outputs += ros
            to_abort += aborts
        return request_outputs, to_abort

    def _put(self, req_id: str, item) -> None:
        q = self._queues.get(req_id)
        if q is None:
            return
        if isinstance(item, BaseException) or item.finished:
            del self._queues[req_id]
            self._pooling.discard(req_id)
        q.put_nowait(item)

    def _on_dead(self, reason: str) -> None:
        if self.dead_reason is not None:
            return
        self.dead_reason = reason
        self.is_ready = False
        self.ready_event.set()
        logger.error("%s", reason)
        for req_id in list(self._queues):
            self._put(req_id, EngineDeadError(reason))
        for fut in self._pending_calls.values():
            if not fut.done():
                fut.set_exception(EngineDeadError(reason))
        self._pending_calls.clear()

    # ---- the EngineClient protocol ----
    async def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str,
        prompt: str | None = None,
        is_pooling: bool = False,
    ) -> AsyncIterator[RequestOutput]:
        """Outputs of one sequence until it finishes. Pooling requests yield one output whose
        `pooled` attribute holds the pooled vector (or scores)."""
        if self.is_dead:
            raise EngineDeadError(self.dead_reason)
        if not self.is_ready:
            raise EngineNotReadyError("the engine is still loading the model")
        if request_id in self._queues:
            raise InvalidRequestError(f"request id {request_id!r} is already in use", "request_id")
        q = OutputCollector()
        self._queues[request_id] = q
        if is_pooling:
            self._pooling.add(request_id)
        else:
            self.output_processor.add_request(request_id, prompt, prompt_token_ids, params)
        self.client.send(AddRequest(request_id, list(prompt_token_ids), params, time.time(), is_pooling))
        async with contextlib.aclosing(stream_until_finished(q, lambda: self.abort(request_id))) as outputs:
            async for item in outputs:
                yield item

    def abort(self, request_id: str) -> None:
        """Drop a request here and in the core. Idempotent; safe from sync code."""
        if self._queues.pop(request_id, None) is None:
            return
        self._pooling.discard(request_id)
        self.output_processor.abort(request_id)
        if not self.is_dead:
            self.client.send(AbortRequest([request_id]))

    def abort_all(self) -> list[str]:
        """Abort every in-flight request with finish_reason "abort" delivered to its stream."""
        ids = list(self._queues)
        if ids and not self.is_dead:
            self.client.send(AbortRequest(ids))
        return ids

    async def get_stats(self, timeout: float = 5.0) -> dict:
        if self.is_dead:
            raise EngineDeadError(self.dead_reason)
        call_id = next(self._call_ids)
        fut = asyncio.get_running_loop().create_future()
        self._pending_calls[call_id] = fut
        self.client.send(UtilityRequest(call_id, "get_stats"))
        try:
            reply = await asyncio.wait_for(fut, timeout)
        finally:
            self._pending_calls.pop(call_id, None)
        if reply.error:
            raise EngineRequestError(reply.error)
        return dict(reply.result or {})

    async def shutdown(self, timeout: float = 5.0) -> None:
        """Stop the core: Shutdown, up to `timeout` s to leave, then terminate/kill; then reap it."""
        await self.client.shutdown(timeout)
