"""EngineFrontEnd: the engine client's half that does not depend on where the core runs.

It holds the request registry (one OutputCollector per request id), runs the OutputProcessor over the
core's outputs, routes them to the collectors, turns stop-string matches into aborts, retries a batch
whose detokenization failed one output at a time (so only the faulty request fails), and fails every
request when the core dies. A transport subclass says how requests reach the core:

- AsyncLLM: the core in its own process, over ZMQ (core_client.py / core_proc.py);
- InProcessEngineClient: the core in this process, stepped by a driver coroutine on a worker thread.

Invariants: every request id has at most one collector; a request that ends without a finished output
(client gone, task cancelled) is aborted in the core, so its KV blocks are freed within a step or two;
after a death every waiting and every new request gets EngineDeadError instead of hanging.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

from fdcli_engine.api.protocol import (
    EngineDeadError,
    EngineNotReadyError,
    EngineRequestError,
    ModelConfig,
)
from fdcli_engine.api.request_log import log_aborted, log_finished, log_received
from fdcli_engine.api.request_stream import OutputCollector, stream_until_finished
from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.outputs import CompletionOutput, EngineCoreOutput, RequestOutput
from fdcli_engine.pooling_params import PoolingParams
from fdcli_engine.request import EngineCoreRequest
from fdcli_engine.resolved_config import ResolvedConfig
from fdcli_engine.sampling_params import SamplingParams

logger = logging.getLogger("fd.serve")


def pooling_output(out: EngineCoreOutput) -> RequestOutput:
    """The one output of a pooling request: no text or tokens, the pooled value in `pooled`."""
    comp = CompletionOutput(0, "", [], finish_reason=out.finish_reason, stop_reason=out.stop_reason)
    finished = out.finish_reason is not None
    return RequestOutput(out.req_id, None, [], [comp], finished, out.num_cached_tokens, pooled=out.pooled)


def model_config_of(
    config: ResolvedConfig, served_model_name: str | None, vocab_size: int = 0
) -> ModelConfig:
    name = served_model_name or config.served_model_name or str(config.model or "fd-model")
    model = str(config.model or config.model_path)
    return ModelConfig(
        model,
        name,
        int(config.max_model_len or 0),
        vocab_size,
        default_sampling_params=dict(config.default_sampling_params),
        max_logprobs=config.max_logprobs,
    )


class EngineFrontEnd:
    """Subclasses implement `_submit` and `_abort_in_core` (and may check requests early)."""

    def __init__(self, config: ResolvedConfig, tokenizer, model_config: ModelConfig, output_processor):
        self.config = config
        self.tokenizer = tokenizer
        self.model_config = model_config
        self.output_processor = output_processor
        self.is_ready = False
        self.was_ready = False
        self.dead_reason: str | None = None
        self.ready_event = asyncio.Event()
        self._collectors: dict[str, OutputCollector] = {}
        self._pooling: set[str] = set()  # pooling requests bypass the output processor
        self._dead_listeners: list[Callable[[str], None]] = []

    # ---- the transport's part ----
    def _submit(self, req: EngineCoreRequest) -> None:
        raise NotImplementedError

    def _abort_in_core(self, req_ids: list[str]) -> None:
        raise NotImplementedError

    def _check_request(self, prompt_token_ids: list[int], params: SamplingParams | PoolingParams) -> None:
        """Checks that can fail the caller at once, before the request is queued."""

    # ---- state ----
    @property
    def is_dead(self) -> bool:
        return self.dead_reason is not None

    @property
    def num_unfinished(self) -> int:
        return len(self._collectors)

    def add_dead_listener(self, callback: Callable[[str], None]) -> None:
        self._dead_listeners.append(callback)

    def _mark_ready(self) -> None:
        self.is_ready = self.was_ready = True
        self.ready_event.set()

    # ---- requests in ----
    def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str,
        prompt: str | None = None,
        mm_features: list | None = None,
    ) -> AsyncIterator[RequestOutput]:
        collector = OutputCollector(params.output_kind)
        return self._stream(request_id, prompt_token_ids, params, collector, prompt, mm_features)

    def encode(
        self,
        prompt_token_ids: list[int],
        pooling_params: PoolingParams,
        request_id: str,
        mm_features: list | None = None,
    ) -> AsyncIterator[RequestOutput]:
        return self._stream(
            request_id, prompt_token_ids, pooling_params, OutputCollector(), None, mm_features
        )

    def _stream(self, request_id, prompt_token_ids, params, collector, prompt=None, mm_features=None):
        """The request is opened at the first iteration; leaving early aborts it. One generator per
        request between its collector and the serving layer: each level costs the front end CPU on
        every streamed token."""

        def open_request() -> None:
            self.open_request(
                request_id, prompt_token_ids, params, collector, prompt, mm_features=mm_features
            )

        return stream_until_finished(collector, lambda: self.abort(request_id), open_request)

    def open_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams | PoolingParams,
        sink,
        prompt: str | None = None,
        index: int = 0,
        mm_features: list | None = None,
    ) -> None:
        """Register a request whose outputs (or error) go to `sink.put_nowait`, and send it to the core.
        `mm_features`: its images (MultiModalFeature, placeholders expanded in prompt_token_ids)."""
        if self.is_dead:
            raise EngineDeadError(self.dead_reason)
        if not self.is_ready:
            raise EngineNotReadyError("the engine is still loading the model")
        if request_id in self._collectors:
            raise InvalidRequestError(f"request id {request_id!r} is already in use", "request_id")
        self._check_request(prompt_token_ids, params)
        if self.config.log_requests:
            log_received(request_id, params, len(prompt_token_ids))
        self._collectors[request_id] = sink
        ids = list(prompt_token_ids)
        if isinstance(params, PoolingParams):
            self._pooling.add(request_id)
            self._submit(EngineCoreRequest(request_id, ids, None, time.time(), params, mm_features or None))
        else:
            self.output_processor.add_request(request_id, prompt, ids, params, index=index)
            self._submit(EngineCoreRequest(request_id, ids, params, time.time(), None, mm_features or None))

    def abort(self, request_id: str) -> None:
        """Drop a request here and in the core. Idempotent; safe from sync code."""
        if self._collectors.pop(request_id, None) is None:
            return
        if self.config.log_requests:
            log_aborted(request_id)
        self._pooling.discard(request_id)
        self.output_processor.abort(request_id)
        if not self.is_dead:
            self._abort_in_core([request_id])

    def abort_all(self) -> list[str]:
        ids = list(self._collectors)
        if ids and not self.is_dead:
            self._abort_in_core(ids)
        return ids

    # ---- outputs out ----
    def _route_outputs(self, outputs: list[EngineCoreOutput]) -> None:
        # Outputs of requests the front end already dropped (aborted) are ignored.
        known = [o for o in outputs if o.req_id in self._collectors]
        if self._pooling:
            for o in [o for o in known if o.req_id in self._pooling]:
                self._put(o.req_id, pooling_output(o))
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
            self._abort_in_core(list(to_abort))

    def _route_one_by_one(self, outputs: list[EngineCoreOutput]) -> tuple[list[RequestOutput], list[str]]:
        request_outputs, to_abort = [], []
        for out in outputs:
            try:
                ros, aborts = self.output_processor.process_outputs([out])
            except Exception as e:
                logger.exception("processing the output of %s failed", out.req_id)
                self._fail_request(out.req_id, EngineRequestError(f"{type(e).__name__} while detokenizing"))
                to_abort.append(out.req_id)
                continue
            request_outputs += ros
            to_abort += aborts
        return request_outputs, to_abort

    def _fail_request(self, req_id: str, error: Exception) -> None:
        self.output_processor.abort(req_id)
        self._put(req_id, error)

    def _put(self, req_id: str, item: RequestOutput | BaseException) -> None:
        q = self._collectors.get(req_id)
        if q is None:
            return
        if isinstance(item, BaseException) or item.finished:
            del self._collectors[req_id]
            self._pooling.discard(req_id)
            if self.config.log_requests:
                log_finished(req_id, item)
        q.put_nowait(item)

    def _on_dead(self, reason: str) -> None:
        """The core is gone: fail every waiting request, refuse new ones, tell the listeners. Once."""
        if self.dead_reason is not None:
            return
        self.dead_reason = reason
        self.is_ready = False
        self.ready_event.set()
        logger.error("%s", reason)
        for req_id in list(self._collectors):
            self.output_processor.abort(req_id)
            self._put(req_id, EngineDeadError(reason))
        for callback in self._dead_listeners:
            try:
                callback(reason)
            except Exception:
                logger.exception("an engine-death listener failed")
