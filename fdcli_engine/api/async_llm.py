"""AsyncLLM: the server's engine client, the front end over the engine core in its own process.

The front end (front_end.py) does the request bookkeeping and output processing; this class is its
transport: requests and aborts go to the engine-core process over ZMQ (core_client.py), and the core's
events (outputs, failed requests, readiness, utility replies, a fatal start, heartbeats) come back on the
event loop. A core that exits, or freezes past the watchdog timeout (core_client.py), fails every
waiting request at once (EngineFrontEnd._on_dead).
"""

from __future__ import annotations

import asyncio
import itertools

from fdcli_engine.api.core_client import DEFAULT_CORE, CoreClient
from fdcli_engine.api.core_messages import (
    AbortRequest,
    FatalMsg,
    OutputsMsg,
    ReadyMsg,
    RequestFailed,
    UtilityReply,
    UtilityRequest,
)
from fdcli_engine.api.front_end import EngineFrontEnd, model_config_of
from fdcli_engine.api.protocol import EngineDeadError, EngineNotReadyError, EngineRequestError, ModelConfig
from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.request import EngineCoreRequest
from fdcli_engine.resolved_config import ResolvedConfig

__all__ = ["AsyncLLM", "EngineDeadError", "EngineNotReadyError", "EngineRequestError", "ModelConfig"]


class AsyncLLM(EngineFrontEnd):
    def __init__(
        self,
        config: ResolvedConfig,
        tokenizer,
        served_model_name: str | None = None,
        output_processor_cls=None,
        core_spec: str = DEFAULT_CORE,
        core_stdout: int | None = None,
    ):
        if output_processor_cls is None:
            from fdcli_engine.output_processor import OutputProcessor as output_processor_cls
        processor = output_processor_cls(tokenizer)
        super().__init__(config, tokenizer, model_config_of(config, served_model_name), processor)
        self._pending_calls: dict[int, asyncio.Future] = {}
        self._call_ids = itertools.count()
        self.client = CoreClient(
            config, self._on_event, self._on_dead, core_spec, core_stdout, busy=self._waits_on_core
        )

    async def start(self) -> None:
        self.client.start()

    def _waits_on_core(self) -> bool:
        """Requests or calls in the core of a loaded engine (loading a model is not stepping)."""
        return self.is_ready and bool(self._collectors or self._pending_calls)

    # ---- the transport ----
    def _submit(self, req: EngineCoreRequest) -> None:
        self.client.send(req)

    def _abort_in_core(self, req_ids: list[str]) -> None:
        self.client.send(AbortRequest(req_ids))

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
            self._fail_request(event.req_id, err)
        elif isinstance(event, UtilityReply):
            fut = self._pending_calls.pop(event.call_id, None)
            if fut and not fut.done():
                fut.set_result(event)
        elif isinstance(event, ReadyMsg):
            if event.max_model_len:
                self.model_config.max_model_len = event.max_model_len
            self.model_config.vocab_size = event.vocab_size
            self._mark_ready()
        elif isinstance(event, FatalMsg):
            self._on_dead(f"the engine core failed to start: {event.message}")

    def _on_dead(self, reason: str) -> None:
        super()._on_dead(reason)
        for fut in self._pending_calls.values():
            if not fut.done():
                fut.set_exception(EngineDeadError(reason))
        self._pending_calls.clear()

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
