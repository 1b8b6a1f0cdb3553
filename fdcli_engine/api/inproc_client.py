"""InProcessEngineClient: the EngineClient protocol over an EngineCore that lives in this process.

It drives the same serving layer as `fd serve` (OpenAIServingChat/Completion) without a second process
or HTTP: `run_batch(engine_factory=...)` takes it where one loaded core is shared (the run-batch tests,
`benchmarks/bench_run_batch.py --inproc`). `fd run-batch` itself uses AsyncLLM (the core in its own
process) so that the serving work overlaps the steps: here the step's Python and it share one GIL. One driver
coroutine owns the core:

    apply queued adds/aborts → step() on a dedicated worker thread → detokenize → route to queues

Invariants:
- Only the driver touches the core, and only between steps: `generate` and `abort` queue their work,
  so a step running on the worker thread never sees the scheduler change under it. Validation that
  only reads the config (`EngineCore.validate_request`) runs in `generate`, so a bad prompt fails the
  caller at once instead of inside the driver.
- Every step runs on the same single worker thread (OpenMP keeps one thread team per calling thread);
  while it runs, the event loop is free, so the serving coroutines tokenize, render and write output
  concurrently with the model.
- Every request id has at most one queue; a request that ends without a finished output (caller
  cancelled, error) is aborted in the core. A failed step fails every waiting request with
  EngineDeadError and marks the client dead, so nothing hangs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from fdcli_engine.api.request_stream import stream_until_finished
from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.outputs import CompletionOutput, RequestOutput
from fdcli_engine.resolved_config import ResolvedConfig
from fdcli_engine.sampling_params import SamplingParams

logger = logging.getLogger("fd.batch")


def _pooling_output(out) -> RequestOutput:
    """The one output of a pooling request: no text or tokens, the pooled value in `.pooled`."""
    comp = CompletionOutput(0, "", [], finish_reason=out.finish_reason, stop_reason=out.stop_reason)
    ro = RequestOutput(out.req_id, None, [], [comp], out.finish_reason is not None, out.num_cached_tokens)
    ro.pooled = getattr(out, "pooled", None)  # read by the pooling serving layer
    return ro


class InProcessEngineClient:
    """`core`/`tokenizer` may be injected (tests); by default both are built from `config`."""

    def __init__(
        self,
        config: ResolvedConfig,
        tokenizer=None,
        served_model_name: str | None = None,
        core=None,
        step_in_thread: bool = True,
    ):
        from fdcli_engine.api.async_llm import ModelConfig
        from fdcli_engine.output_processor import OutputProcessor

        self.config = config
        if core is None:
            from fdcli_engine.engine import EngineCore

            core = EngineCore(config)
        self.core = core
        if tokenizer is None:
            from fdcli_engine.tokenizer import load_tokenizer

            tokenizer = load_tokenizer(config)
        self.tokenizer = tokenizer
        name = served_model_name or config.served_model_name or str(config.model or "fd-model")
        self.model_config = ModelConfig(
            str(config.model or config.model_path),
            name,
            int(config.max_model_len or 0),
            int(getattr(core, "vocab_size", 0)),
        )
        self.output_processor = OutputProcessor(tokenizer)
        self.is_ready = True
        self.dead_reason: str | None = None
        self._queues: dict[str, asyncio.Queue] = {}
        self._pending_adds: list = []  # EngineCoreRequest, applied by the driver between steps
        self._pending_aborts: list[str] = []
        self._pooling: set[str] = set()  # pooling requests: outputs bypass the OutputProcessor
        self._stats: dict = {}
        self._wake: asyncio.Event | None = None
        self._driver: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="fd-step") if step_in_thread else None

    @property
    def is_dead(self) -> bool:
        return self.dead_reason is not None

    @property
    def num_unfinished(self) -> int:
        return len(self._queues)

    # ---- the EngineClient protocol ----
    async def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str,
        prompt: str | None = None,
        is_pooling: bool = False,
    ) -> AsyncIterator[RequestOutput]:
        """Outputs of one sequence until it finishes. A pooling request yields one output whose
        `pooled` attribute holds the pooled vector (or scores); it bypasses detokenization."""
        from fdcli_engine.api.async_llm import EngineDeadError
        from fdcli_engine.engine import EngineCoreRequest

        if self.is_dead:
            raise EngineDeadError(self.dead_reason)
        if request_id in self._queues:
            raise InvalidRequestError(f"request id {request_id!r} is already in use", "request_id")
        if is_pooling:
            self.core.validate_request(prompt_token_ids, params, is_pooling=True)
        else:  # positional form: cores (and test doubles) without pooling support take two arguments
            self.core.validate_request(prompt_token_ids, params)
        self._ensure_driver()
        q: asyncio.Queue = asyncio.Queue()
        self._queues[request_id] = q
        if is_pooling:
            self._pooling.add(request_id)
        else:
            self.output_processor.add_request(request_id, prompt, prompt_token_ids, params)
        core_req = EngineCoreRequest(request_id, list(prompt_token_ids), params, time.time(), is_pooling)
        self._pending_adds.append(core_req)
        self._wake.set()
        async with contextlib.aclosing(stream_until_finished(q, lambda: self.abort(request_id))) as outputs:
            async for item in outputs:
                yield item

    def abort(self, request_id: str) -> None:
        """Drop a request here and (at the next step boundary) in the core. Idempotent."""
        if self._queues.pop(request_id, None) is None:
            return
        self._pooling.discard(request_id)
        self.output_processor.abort(request_id)
        self._pending_aborts.append(request_id)
        if self._wake is not None:
            self._wake.set()

    async def get_stats(self) -> dict:
        """The scheduler's counters as of the last step (read between steps, never during one)."""
        if not self._stats and (self._driver is None or self._driver.done()):
            self._stats = self.core.get_stats()
        return dict(self._stats)

    async def shutdown(self) -> None:
        if self._driver is not None and not self._driver.done():
            self._driver.cancel()
            try:
                await self._driver
            except asyncio.CancelledError:
                pass
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    # ---- the driver ----
    def _ensure_driver(self) -> None:
        if self._driver is None or self._driver.done():
            self._wake = asyncio.Event()
            self._driver = asyncio.get_running_loop().create_task(self._drive(), name="fd-engine-driver")

    def _apply_pending(self) -> None:
        adds, self._pending_adds = self._pending_adds, []
        aborts, self._pending_aborts = self._pending_aborts, []
        dropped = set(aborts)
        for req in adds:
            if req.req_id in dropped:
                continue
            try:
                self.core.add_request(req)
            except InvalidRequestError as e:  # only this request is wrong: fail it, keep the engine
                self.output_processor.abort(req.req_id)
                self._pooling.discard(req.req_id)
                q = self._queues.pop(req.req_id, None)
                if q is not None:
                    q.put_nowait(e)
        if aborts:
            self.core.abort_requests(aborts)

    async def _drive(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                self._apply_pending()
                if not self.core.has_unfinished_requests():
                    self._wake.clear()
                    if not self._pending_adds and not self._pending_aborts:
                        await self._wake.wait()
                    continue
                if self._executor is not None:
                    outputs = await loop.run_in_executor(self._executor, self.core.step)
                else:
                    outputs = self.core.step()
                    await asyncio.sleep(0)
                self._stats = self.core.get_stats()
                self._route(outputs)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a failed step leaves the core in an unknown state: stop for good
            logger.exception("engine step failed")
            self._fail_all(f"the engine step failed: {type(e).__name__}: {e}")

    def _route(self, outputs) -> None:
        known = [o for o in outputs if o.req_id in self._queues]
        if self._pooling:
            pooled = [o for o in known if o.req_id in self._pooling]
            known = [o for o in known if o.req_id not in self._pooling]
            for o in pooled:
                self._deliver(_pooling_output(o))
        if not known:
            return
        try:
            request_outputs, to_abort = self.output_processor.process_outputs(known)
        except Exception:  # one request's output broke detokenization: redo them one by one
            request_outputs, to_abort = self._route_one_by_one(known)
        for ro in request_outputs:
            self._deliver(ro)
        # Stop strings matched: finished here; free the request in the core before the next step.
        self._pending_aborts.extend(to_abort)

    def _deliver(self, ro: RequestOutput) -> None:
        q = self._queues.get(ro.request_id)
        if q is None:
            return
        if ro.finished:
            del self._queues[ro.request_id]
            self._pooling.discard(ro.request_id)
        q.put_nowait(ro)

    def _route_one_by_one(self, outputs):
        """Process outputs singly; a request whose output fails is failed and aborted alone."""
        from fdcli_engine.api.async_llm import EngineRequestError

        results, to_abort = [], []
        for o in outputs:
            try:
                ros, aborts = self.output_processor.process_outputs([o])
            except Exception as e:
                logger.exception("output processing failed for %s", o.req_id)
                q = self._queues.pop(o.req_id, None)
                self.output_processor.abort(o.req_id)
                to_abort.append(o.req_id)
                if q is not None:
                    q.put_nowait(EngineRequestError(f"output processing failed: {type(e).__name__}: {e}"))
                continue
            results.extend(ros)
            to_abort.extend(aborts)
        return results, to_abort

    def _fail_all(self, reason: str) -> None:
        from fdcli_engine.api.async_llm import EngineDeadError

        self.dead_reason = reason
        self.is_ready = False
        for req_id, q in list(self._queues.items()):
            del self._queues[req_id]
            q.put_nowait(EngineDeadError(reason))
