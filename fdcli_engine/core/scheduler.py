"""Continuous-batching scheduler with a per-step token budget, chunked prefill, prefix caching, and
preemption by recompute.

Each step: running requests first (in admission order), each getting what remains of its known tokens
(1 for a decoding request, the rest of the prompt for one mid-prefill) within the token budget; when
blocks run out the most recently admitted running request is preempted (its blocks freed, its tokens,
including those already generated, kept so it is recomputed later — nothing is lost or repeated). Then,
if nothing was preempted, waiting requests are admitted in FIFO order while budget, sequence slots and
blocks allow.

Token-level stops and the length stop are decided here (`_check_stop`); the division of every stop rule
between the scheduler, the OutputProcessor and the sampler is written in step_types' docstring.
"""

from __future__ import annotations

from collections import deque

from fdcli_engine.core.kv_cache_manager import KVCacheManager
from fdcli_engine.outputs import EngineCoreOutput
from fdcli_engine.request import Request, RequestStatus
from fdcli_engine.step_types import ModelRunnerOutput, ScheduledRequest, SchedulerOutput


class Scheduler:
    def __init__(
        self,
        kv: KVCacheManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        enable_chunked_prefill: bool = True,
        eos_token_ids: set[int] | frozenset[int] = frozenset(),
    ):
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.enable_chunked_prefill = enable_chunked_prefill
        self.eos_token_ids = set(eos_token_ids)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._finished_ids: set[str] = set()
        self.num_preemptions = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0

    # -- requests in and out ---------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if request.req_id in self.requests:
            raise ValueError(f"request id {request.req_id!r} is already in the engine")
        self.requests[request.req_id] = request
        self.waiting.append(request)

    def abort_requests(self, req_ids) -> list[EngineCoreOutput]:
        outs = []
        for rid in req_ids:
            req = self.requests.get(rid)
            if req is None:
                continue
            self._finish(req, RequestStatus.FINISHED_ABORTED)
            outs.append(self._core_output(req, []))
        return outs

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def _finish(self, req: Request, status: RequestStatus) -> None:
        req.status = status
        if req in self.running:
            self.running.remove(req)
        else:
            try:
                self.waiting.remove(req)
            except ValueError:
                pass
        self.kv.free(req)
        self.requests.pop(req.req_id, None)
        self._finished_ids.add(req.req_id)

    # -- one step --------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        preempted = 0
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            while not self.kv.allocate_slots(req, num_new):
                victim = self.running.pop()
                self._preempt(victim)
                preempted += 1
                if victim is req:
                    break
            if req.status is not RequestStatus.RUNNING:
                break
            scheduled.append(self._scheduled(req, num_new))
            budget -= num_new
            i += 1

        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not preempted:
            req = self.waiting[0]
            hit_blocks, num_hit = self.kv.get_computed_blocks(req)
            num_new = req.num_tokens - num_hit
            if num_new > budget and not self.enable_chunked_prefill:
                break
            num_new = min(num_new, budget)
            if not self.kv.allocate_slots(req, num_new, hit_blocks):
                break
            self.waiting.popleft()
            self.kv.record_lookup(req.num_tokens, num_hit)
            req.num_computed_tokens = num_hit
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = num_hit
                self.prompt_tokens_total += req.num_prompt_tokens
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            scheduled.append(self._scheduled(req, num_new))
            budget -= num_new

        finished, self._finished_ids = self._finished_ids, set()
        return SchedulerOutput(
            scheduled=scheduled,
            num_scheduled_tokens=self.max_num_batched_tokens - budget,
            finished_req_ids=finished,
            num_preempted=preempted,
        )

    def _scheduled(self, req: Request, num_new: int) -> ScheduledRequest:
        start = req.num_computed_tokens
        return ScheduledRequest(
            req_id=req.req_id,
            token_ids=req.all_token_ids[start : start + num_new],
            num_computed_tokens=start,
            block_ids=list(req.block_ids),
            sampling_params=req.sampling_params,
            do_sample=start + num_new == req.num_tokens and req.pooling_params is None,
            output_token_ids=req.output_token_ids,
            prompt_token_ids=req.prompt_token_ids,
            pooling_params=req.pooling_params,
            needs_prompt_logprobs=(
                req.wants_prompt_logprobs
                and not req.prompt_logprobs_sent
                and start < req.num_prompt_tokens - 1
            ),
        )

    def _preempt(self, req: Request) -> None:
        self.kv.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    # -- results ---------------------------------------------------------------------------------
    def update_from_output(self, so: SchedulerOutput, out: ModelRunnerOutput) -> list[EngineCoreOutput]:
        results: list[EngineCoreOutput] = []
        for sr in so.scheduled:
            req = self.requests.get(sr.req_id)
            if req is None or req.status is not RequestStatus.RUNNING:
                continue
            req.num_computed_tokens += len(sr.token_ids)
            if sr.pooling_params is not None:
                if req.num_computed_tokens == req.num_tokens:
                    self._finish(req, RequestStatus.FINISHED_STOPPED)
                    results.append(self._core_output(req, [], pooled=out.pooled.get(req.req_id)))
                continue
            chunk = out.prompt_logprobs.get(sr.req_id)
            if chunk is not None:
                req.add_prompt_logprobs(*chunk)
            token = out.sampled_token_ids.get(sr.req_id)
            if token is None:
                continue
            req.append_output_token(token)
            self.generation_tokens_total += 1
            status = self._check_stop(req, token)
            logprobs = out.logprobs.get(sr.req_id)
            if status is not None:
                self._finish(req, status)
            core_out = self._core_output(req, [token], [logprobs] if logprobs is not None else None)
            core_out.prompt_logprobs = req.take_prompt_logprobs()
            results.append(core_out)
        return results

    def _check_stop(self, req: Request, token: int) -> RequestStatus | None:
        params = req.sampling_params
        # Like the sampler's mask: a stop token counts only after min_tokens other tokens.
        if req.num_output_tokens > params.min_tokens:
            if not params.ignore_eos and token in self.eos_token_ids:
                return RequestStatus.FINISHED_STOPPED
            if token in params.stop_token_ids:
                req.stop_reason = token
                return RequestStatus.FINISHED_STOPPED
        if req.num_output_tokens >= req.max_tokens or req.num_tokens >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def _core_output(self, req: Request, new_ids: list[int], logprobs=None, pooled=None) -> EngineCoreOutput:
        finished = req.status.is_finished
        return EngineCoreOutput(
            req_id=req.req_id,
            new_token_ids=new_ids,
            new_logprobs=logprobs,
            finish_reason=req.status.value if finished else None,
            stop_reason=req.stop_reason if finished else None,
            num_prompt_tokens=req.num_prompt_tokens,
            num_cached_tokens=max(req.num_cached_tokens, 0),
            pooled=pooled.tolist() if pooled is not None else None,
        )

    def get_stats(self) -> dict:
        return {
            "num_running": len(self.running),
            "num_waiting": len(self.waiting),
            "kv_cache_usage": self.kv.usage(),
            "prefix_cache_queries": self.kv.prefix_cache_queries,
            "prefix_cache_hits": self.kv.prefix_cache_hits,
            "num_preemptions": self.num_preemptions,
            "prompt_tokens_total": self.prompt_tokens_total,
            "generation_tokens_total": self.generation_tokens_total,
        }
