"""The runner's structured-output state: one grammar matcher per constrained request, and the step's
allowed-token bitmask, filled on a worker thread while the model's forward runs.

Invariants:
- A matcher is current at the start of a step: it has consumed every output token of its request
  except those before the constraint starts (`start_after_token_ids`). It catches up from the
  request's `output_token_ids` (the scheduler's record, shared read-only) at the start of each step,
  so a token the runner sampled but the scheduler did not keep is never consumed.
- Matchers live until the request's id is in SchedulerOutput.finished_req_ids. Preemption does not
  drop them (core/scheduler.py: a preempted request keeps its output tokens and is recomputed, never
  re-sampled), so its matcher stays right; were one dropped, the fresh matcher would replay the kept
  output and end in the same state. n > 1 children are separate requests with matchers of their own.
- Only the worker touches the matchers between `begin` and `wait`; the main thread meanwhile runs the
  forward (paddle and llguidance's fill release the GIL). A step with no constrained row submits
  nothing.
- A constraint starts compiling when its request reaches the engine (`prepare`, on a thread of its own);
  the mask worker waits for it only when the request is first scheduled.
- Speculative decoding: a constrained request's draft rows are masked as if the drafts were consumed;
  the matcher gives them back before the step ends (`_fill_draft_rows`), so the invariant above holds.
- A row whose grammar allows nothing, or whose matcher is done (terminated) or failed, may only
  produce EOS. A constraint that fails to compile fails its request only (`StepMasks.failed`).
"""

from __future__ import annotations

import itertools
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.step_types import ScheduledRequest

logger = logging.getLogger(__name__)


@dataclass
class _State:
    matcher: object | None  # GrammarMatcher; None once failed
    trigger: list[int]  # start_after_token_ids
    started: bool
    num_seen: int = 0  # output tokens accounted for (consumed, or scanned for the trigger)
    done: bool = False  # terminated or errored: EOS only from here on
    error: str | None = None  # set when the constraint could not be compiled


@dataclass
class StepMasks:
    """One step's masks over the sampling rows (the sampler's `reqs` order)."""

    bitmask: np.ndarray  # int32 [rows, ceil(V / 32)]; constrained rows only are meaningful
    rows: list[int]  # the masked sampling rows (constrained, and started)
    # req_id -> reason: requests whose constraint failed to compile; the engine ends them.
    failed: dict[str, str] = field(default_factory=dict)


class GrammarMasks:
    def __init__(self, backend, eos_token_ids: set[int], make_backend=None):
        """`backend`: a GrammarBackend, or None; `make_backend`: builds it on the first constrained
        request instead (loading llguidance and its tokenizer costs an engine start that serves none
        nothing). Neither: structured outputs are off."""
        self.backend = backend
        self._make_backend = make_backend
        self._backend_lock = threading.Lock()  # the compile thread and the mask worker both build it
        self.eos_token_ids = sorted(eos_token_ids)
        self._states: dict[str, _State] = {}
        self._compiling: dict[str, Future] = {}  # req_id -> its CompiledGrammar, from `prepare`
        self._executor: ThreadPoolExecutor | None = None
        self._compiler: ThreadPoolExecutor | None = None

    def __len__(self) -> int:
        return len(self._states)

    def prepare(self, req_id: str, params) -> None:
        """Start compiling a new request's constraint (`params`: its StructuredOutputsParams) on a
        thread of its own, so the compile overlaps the request's wait and prefill instead of holding
        up the step that first samples it."""
        if self._compiler is None:
            self._compiler = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fd-grammar-compile")
        self._compiling[req_id] = self._compiler.submit(self._compile, params)

    def check(self, params) -> None:
        """Compile `params` now, on the caller's thread: InvalidRequestError when it cannot be. The
        backend caches what it compiles, so the request's own compile (`prepare`) is then a hit. For
        the synchronous offline LLM, which refuses a bad constraint as vLLM does, with a ValueError
        before the request is queued; the server compiles in its serving layer instead."""
        self._compile(params)

    def drop(self, req_ids) -> None:
        for rid in req_ids:
            self._states.pop(rid, None)
            pending = self._compiling.pop(rid, None)
            if pending is not None:
                pending.cancel()

    def begin(
        self, scheduled: list[ScheduledRequest], sampling: list[ScheduledRequest]
    ) -> Future | StepMasks | None:
        """Start this step's masks: None when no row is constrained (nothing submitted). `scheduled`:
        every request of the step (a new constrained one is compiled when first seen, prefill
        included); `sampling`: the rows that sample, in the sampler's order."""
        new = [
            sr
            for sr in scheduled
            if sr.sampling_params is not None
            and sr.sampling_params.structured_outputs is not None
            and sr.req_id not in self._states
        ]
        rows = [
            i
            for i, sr in enumerate(sampling)
            if sr.sampling_params.structured_outputs is not None or sr.req_id in self._states
        ]
        if not new and not rows:
            return None
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fd-grammar")
        return self._executor.submit(self._fill, new, sampling, rows)

    @staticmethod
    def wait(pending: Future | StepMasks | None) -> StepMasks | None:
        if isinstance(pending, Future):
            return pending.result()
        return pending

    # -- on the worker ---------------------------------------------------------------------------
    def _fill(self, new: list[ScheduledRequest], sampling: list[ScheduledRequest], rows: list[int]):
        failed: dict[str, str] = {}
        for sr in new:
            state = self._states[sr.req_id] = self._register(sr)
            if state.error is not None:
                failed[sr.req_id] = state.error
        bitmask = self._allocate(len(sampling))
        kept: list[int] = []
        # A request's rows are consecutive: its own, then one per draft (runner/spec_decode.row_views).
        for rid, group in itertools.groupby(rows, key=lambda i: sampling[i].req_id):
            first, *drafts = group
            state = self._states[rid]
            if state.error is not None:
                failed[rid] = state.error
                continue
            masked = self._fill_row(sampling[first], state, bitmask, first)
            if masked and drafts:
                self._fill_draft_rows(state, [sampling[i] for i in drafts], bitmask, drafts)
            elif state.done:  # failed: EOS only, on every row
                for i in drafts:
                    self._eos_only(bitmask[i])
            if masked or state.done:
                kept.extend([first, *drafts])
        return StepMasks(bitmask=bitmask, rows=kept, failed=failed)

    def _fill_row(self, sr: ScheduledRequest, state: _State, bitmask: np.ndarray, i: int) -> bool:
        """Catch the matcher up with the request's output and fill row i; False when the row is not
        constrained (yet) or ended on a grammar fault."""
        try:
            self._catch_up(sr.req_id, state, sr.output_token_ids)
            if not state.started:
                return False  # not constrained yet: the row is not masked
            if not state.done:
                state.matcher.fill_bitmask(bitmask, i)
                if not bitmask[i].any():
                    state.done = True  # the grammar allows nothing: only EOS can end the row
        except Exception as exc:  # a grammar fault ends the constraint, not the engine
            state.num_seen = len(sr.output_token_ids)
            self._fail(sr.req_id, state, f"{type(exc).__name__}: {exc}")
            self._eos_only(bitmask[i])
            return False
        if state.done:
            self._eos_only(bitmask[i])
        return True

    def _fill_draft_rows(self, state: _State, views: list[ScheduledRequest], bitmask, rows) -> None:
        """The rows after each draft: the matcher takes the drafts in turn (each row's mask is the
        grammar's after the drafts before it), then gives them back, since which are accepted is only
        known after sampling; the next step's catch-up consumes the kept ones. A draft its row's mask
        refuses can never be accepted, so the rows after it are never emitted and keep a copy of the
        previous mask. Rows of a request are consecutive, so row i - 1 is the draft's own row."""
        consumed = 0
        done = state.done
        for n, (view, i) in enumerate(zip(views, rows)):
            draft = view.output_token_ids[-1]
            # Checked on the mask first: a matcher that accepts a refused token stays in error.
            if not done and n == consumed and _allows(bitmask[i - 1], draft) and state.matcher.accept(draft):
                consumed += 1
                done = state.matcher.is_terminated()
                if not done:
                    state.matcher.fill_bitmask(bitmask, i)
                    done = not bitmask[i].any()
                if done:
                    self._eos_only(bitmask[i])
            elif done and n == consumed:
                self._eos_only(bitmask[i])
            else:  # this row's draft, or one before it, was refused: never emitted
                bitmask[i] = bitmask[i - 1]
        if consumed:
            state.matcher.rollback(consumed)

    def _allocate(self, n: int) -> np.ndarray:
        if self.backend is not None:
            return self.backend.allocate_bitmask(n)
        return np.full((n, 1), -1, dtype=np.int32)

    def _get_backend(self):
        with self._backend_lock:
            if self.backend is None and self._make_backend is not None:
                make, self._make_backend = self._make_backend, None
                try:
                    self.backend = make()
                except Exception:
                    logger.exception("the grammar backend failed to load: structured outputs are off")
            return self.backend

    def _compile(self, params):
        backend = self._get_backend()
        if backend is None:
            raise InvalidRequestError(
                "structured outputs are not available in this engine", param="structured_outputs"
            )
        return backend.compile(params)

    def _register(self, sr: ScheduledRequest) -> _State:
        so = sr.sampling_params.structured_outputs
        trigger = list(so.start_after_token_ids)
        pending = self._compiling.pop(sr.req_id, None)
        try:
            grammar = pending.result() if pending is not None else self._compile(so)
            matcher = grammar.matcher()
        except InvalidRequestError as exc:  # the engine logs it as it ends the request
            return _State(None, trigger, False, error=str(exc))
        except Exception as exc:  # defensive: the serving layer compiled it first
            logger.exception("request %s: constraint failed to compile", sr.req_id)
            return _State(None, trigger, False, error=f"the constraint failed to compile: {exc}")
        return _State(matcher, trigger, started=not trigger)

    def _catch_up(self, req_id: str, state: _State, output: list[int]) -> None:
        trigger = state.trigger
        for k in range(state.num_seen, len(output)):
            if not state.started:
                end = k + 1
                if end >= len(trigger) and output[end - len(trigger) : end] == trigger:
                    state.started = True
            elif not state.done:
                tok = output[k]
                if not state.matcher.accept(tok):
                    self._fail(req_id, state, f"token {tok} was not allowed")
                elif state.matcher.is_terminated():
                    state.done = True
        state.num_seen = len(output)

    @staticmethod
    def _fail(req_id: str, state: _State, why: str) -> None:
        logger.warning("request %s: grammar matcher stopped (%s); only EOS is allowed now", req_id, why)
        state.done = True

    def _eos_only(self, row: np.ndarray) -> None:
        row[:] = 0
        bits = row.view(np.uint32)
        for e in self.eos_token_ids:
            if (e >> 5) < bits.shape[0]:
                bits[e >> 5] |= np.uint32(1 << (e & 31))


def _allows(row: np.ndarray, token: int) -> bool:
    word = token >> 5
    return word < row.shape[0] and bool((int(row[word]) >> (token & 31)) & 1)


def allowed_rows(bitmask: np.ndarray, rows: list[int], vocab_size: int) -> np.ndarray:
    """bool [len(rows), vocab_size]: the tokens each listed row of `bitmask` allows."""
    packed = np.ascontiguousarray(bitmask[rows]).view(np.uint8)
    return np.unpackbits(packed, axis=1, bitorder="little")[:, :vocab_size].astype(bool)
