"""InProcessEngineClient: the engine front end over an EngineCore that lives in this process.

It drives the same serving layer as `fd serve` (OpenAIServingChat/Completion) without a second process
or HTTP: `run_batch(engine_factory=...)` takes it where one loaded core is shared (the run-batch tests,
`benchmarks/bench_run_batch.py --inproc`), and `LLM` wraps it synchronously. `fd run-batch` itself uses
AsyncLLM (the core in its own process) so that the serving work overlaps the steps: here the step's
Python and it share one GIL. One driver coroutine owns the core:

    apply queued adds/aborts → step() on a dedicated worker thread → detokenize → route to collectors

Invariants:
- Only the driver touches the core, and only between steps: `generate` and `abort` queue their work,
  so a step running on the worker thread never sees the scheduler change under it. Validation that
  only reads the config (`EngineCore.validate_request`) runs in `generate`, so a bad prompt fails the
  caller at once instead of inside the driver. Called outside an event loop (the synchronous `LLM`,
  which steps the core itself), there is no driver, and work reaches the core at once.
- Every step runs on the same single worker thread (OpenMP keeps one thread team per calling thread);
  while it runs, the event loop is free, so the serving coroutines tokenize, render and write output
  concurrently with the model.
- A failed step fails every waiting request with EngineDeadError and marks the client dead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from concurrent.futures import ThreadPoolExecutor

from fdcli_engine.api.front_end import EngineFrontEnd, model_config_of
from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.pooling_params import PoolingParams
from fdcli_engine.request import EngineCoreRequest
from fdcli_engine.resolved_config import ResolvedConfig
from fdcli_engine.sampling_params import SamplingParams

logger = logging.getLogger("fd.batch")


class InProcessEngineClient(EngineFrontEnd):
    """`core`/`tokenizer` may be injected (tests); by default both are built from `config`."""

    def __init__(
        self,
        config: ResolvedConfig,
        tokenizer=None,
        served_model_name: str | None = None,
        core=None,
        step_in_thread: bool = True,
    ):
        from fdcli_engine.output_processor import OutputProcessor

        if core is None:
            from fdcli_engine.engine import EngineCore

            core = EngineCore(config)
        self.core = core
        if tokenizer is None:
            from fdcli_engine.tokenizer import load_tokenizer

            tokenizer = load_tokenizer(config)
        model_config = model_config_of(config, served_model_name, int(getattr(core, "vocab_size", 0)))
        super().__init__(config, tokenizer, model_config, OutputProcessor(tokenizer))
        self._mark_ready()
        self._pending_adds: list[EngineCoreRequest] = []  # applied by the driver between steps
        self._pending_aborts: list[str] = []
        self._stats: dict = {}
        self._wake: asyncio.Event | None = None
        self._driver: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="fd-step") if step_in_thread else None

    async def start(self) -> None:
        """Nothing to start: the core was built with the client; the driver starts with a request."""

    # ---- the transport ----
    def _check_request(self, prompt_token_ids: list[int], params: SamplingParams | PoolingParams) -> None:
        self.core.validate_request(prompt_token_ids, params)

    def _submit(self, req: EngineCoreRequest) -> None:
        if not _in_event_loop():  # the synchronous LLM: no driver, no step in flight
            self._add_to_core(req)
            return
        self._ensure_driver()
        self._pending_adds.append(req)
        self._wake.set()

    def _abort_in_core(self, req_ids: list[str]) -> None:
        if not _in_event_loop():
            self._route_outputs(self.core.abort_requests(req_ids))
            return
        self._pending_aborts.extend(req_ids)
        if self._wake is not None:
            self._wake.set()

    def _add_to_core(self, req: EngineCoreRequest) -> None:
        try:
            self.core.add_request(req)
        except InvalidRequestError as e:  # only this request is wrong: fail it, keep the engine
            self._fail_request(req.req_id, e)

    def _apply_pending(self) -> None:
        adds, self._pending_adds = self._pending_adds, []
        aborts, self._pending_aborts = self._pending_aborts, []
        dropped = set(aborts)
        for req in adds:
            if req.req_id not in dropped:
                self._add_to_core(req)
        if aborts:  # abort_all's requests still have collectors: their "abort" outputs end their streams
            self._route_outputs(self.core.abort_requests(aborts))

    # ---- stepping ----
    def _ensure_driver(self) -> None:
        if self._driver is None or self._driver.done():
            self._wake = asyncio.Event()
            self._driver = asyncio.get_running_loop().create_task(self._drive(), name="fd-engine-driver")

    def step(self) -> None:
        """One step on the caller's thread: the synchronous LLM's loop, outside any event loop."""
        self._apply_pending()
        self._route_outputs(self.core.step())

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
                self._route_outputs(outputs)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a failed step leaves the core in an unknown state: stop for good
            logger.exception("engine step failed")
            self._on_dead(f"the engine step failed: {type(e).__name__}: {e}")

    async def get_stats(self) -> dict:
        """The scheduler's counters as of the last step (read between steps, never during one)."""
        if not self._stats and (self._driver is None or self._driver.done()):
            self._stats = self.core.get_stats()
        return dict(self._stats)

    async def shutdown(self, timeout: float = 5.0) -> None:
        """Stop the driver and the worker thread (`timeout` is the protocol's; nothing here waits)."""
        if self._driver is not None and not self._driver.done():
            self._driver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._driver
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        stop_core = getattr(self.core, "shutdown", None)
        if stop_core is not None:  # tensor parallel: the core's worker ranks
            stop_core()


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
