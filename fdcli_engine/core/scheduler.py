"""Continuous-batching scheduler with a per-step token budget, chunked prefill, prefix caching, and
preemption by recompute.

Each step: running requests first (in admission order), each getting what remains of its known tokens
(1 for a decoding request, the rest of the prompt for one mid-prefill) within the token budget; when
blocks run out the most recently admitted running request is preempted (its blocks freed, its tokens,
including those already generated, kept so it is recomputed later — nothing is lost or repeated). Then,
if nothing was preempted, waiting requests are admitted in FIFO order while budget, sequence slots and
blocks allow.

A KV connector (kv_transfer/base.py, bound through the KVCacheManager) may supply whole blocks after a
waiting request's prefix hit: the scheduler allocates them, has the connector load them, and computes
in the same step whatever it did not load. A request the connector is not ready for (None) stays in
its place while the ones behind it are admitted.

Each request records vLLM's events (QUEUED when added, SCHEDULED when admitted from the waiting queue,
again after a preemption, PREEMPTED), handed out with its next output; every output of a step carries
the time the step ended (its tokens' time). The front end turns them into per-request intervals.

Each prompt is counted once, when first admitted: in prompt_tokens_total, by where its K/V came from,
and in its step's tokens (core/token_stats.py, vLLM's prompt-source counters and tokens per step).

Token-level stops and the length stop are decided here (`_check_stop`); the division of every stop rule
between the scheduler, the OutputProcessor and the sampler is written in step_types' docstring.

Speculative decoding: a decoding request with drafts (proposed by the runner last step) is scheduled
with them after its last token, within the budget and never beyond what max_tokens and max_model_len
leave (so a step cannot emit past a limit); with a model proposer its table also gets the proposer's
lookahead slots. Of the tokens a step returns (accepted drafts, then the target's own) each is appended
and checked in turn; the first stop ends the request and drops the rest. Only the accepted drafts' K/V
count as computed. Preemption drops pending drafts. `core/draft_policy.py` decides who drafts.
"""

from __future__ import annotations

import time
from collections import deque

from fdcli_engine.core.draft_policy import DraftPolicy
from fdcli_engine.core.kv_cache_manager import KVCacheManager
from fdcli_engine.core.token_stats import IterationTokens, PromptTokenSources
from fdcli_engine.outputs import EngineCoreEventType, EngineCoreOutput
from fdcli_engine.reasoning_budget import answer_limit_reached
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
        num_speculative_tokens: int = 0,
        num_lookahead_slots: int = 0,
        disable_by_batch_size: int | None = None,
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
        self.prompt_sources = PromptTokenSources()
        self.iteration_tokens = IterationTokens()
        self._step_prompt_tokens = 0  # prompt tokens counted by the step being scheduled
        self.num_lookahead_slots = num_lookahead_slots
        self.drafts = DraftPolicy(num_speculative_tokens, disable_by_batch_size)
        self.spec_stats = SpecDecodeStats(num_speculative_tokens) if num_speculative_tokens else None
        self.num_deferred = 0  # waiting requests the last step left for their connector
        self.num_connector_loaded_tokens = 0
        # vLLM's external prefix cache: tokens a new request asked the connector for, and those it had.
        self.connector_prefix_cache_queries = 0
        self.connector_prefix_cache_hits = 0

    @property
    def connector(self):
        return self.kv.connector

    # -- requests in and out ---------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if request.req_id in self.requests:
            raise ValueError(f"request id {request.req_id!r} is already in the engine")
        self.requests[request.req_id] = request
        self.waiting.append(request)
        request.record_event(EngineCoreEventType.QUEUED)

    def abort_requests(self, req_ids) -> list[EngineCoreOutput]:
        outs = []
        now = time.monotonic()
        for rid in req_ids:
            req = self.requests.get(rid)
            if req is None:
                continue
            self._finish(req, RequestStatus.FINISHED_ABORTED)
            outs.append(self._core_output(req, [], now))
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
        self.drafts.drop(req.req_id)

    # -- one step --------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        now = time.monotonic()  # the time of this step's SCHEDULED and PREEMPTED events
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        preempted = 0
        self._step_prompt_tokens = 0
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            # The guards skip two calls that return [] and 0 on a plain decode step.
            drafts = self._drafts_for(req, num_new, budget) if req.spec_token_ids else []
            slots = num_new + len(drafts)
            if self.num_lookahead_slots:
                slots += self._lookahead(req, slots)
            while not self.kv.allocate_slots(req, slots):
                victim = self.running.pop()
                self._preempt(victim, now)
                preempted += 1
                if victim is req:
                    break
            if req.status is not RequestStatus.RUNNING:
                break
            scheduled.append(self._scheduled(req, num_new, drafts))
            budget -= num_new + len(drafts)
            i += 1

        self.num_deferred = 0
        if not preempted and self.waiting:
            budget = self._admit_waiting(budget, scheduled, now)

        finished, self._finished_ids = self._finished_ids, set()
        return SchedulerOutput(
            scheduled=scheduled,
            num_scheduled_tokens=self.max_num_batched_tokens - budget,
            finished_req_ids=finished,
            num_preempted=preempted,
        )

    def _admit_waiting(self, budget: int, scheduled: list[ScheduledRequest], now: float) -> int:
        """Admit waiting requests in FIFO order while budget, sequence slots and blocks allow (a step
        that preempted admits none); appends them to `scheduled`, returns the budget left."""
        skipped = 0  # waiting requests whose connector is not ready yet: they keep their places
        while len(self.waiting) > skipped and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[skipped]
            hit_blocks, num_hit = self.kv.get_computed_blocks(req)
            num_ext = self._connector_tokens(req, num_hit)
            if num_ext is None:
                skipped += 1
                continue
            num_new = req.num_tokens - num_hit - num_ext
            if num_new > budget and not self.enable_chunked_prefill:
                break
            num_new = min(num_new, budget)
            lookahead = self._lookahead(req, num_hit + num_ext + num_new)  # num_computed_tokens is 0 here
            if not self.kv.allocate_slots(req, num_ext + num_new + lookahead, hit_blocks):
                break
            del self.waiting[skipped]
            # As vLLM's prefix-cache counters: the lookups of requests not preempted (a re-admission
            # finds its own blocks again, which would count as hits no other request had).
            if not req.num_preemptions:
                self.kv.record_lookup(req.num_tokens, num_hit)
            if self.connector is not None and not req.wants_prompt_logprobs and not req.num_preemptions:
                # As vLLM: at admission, the tokens past the pool's hit, of a request not preempted.
                self.connector_prefix_cache_queries += req.num_tokens - num_hit
                self.connector_prefix_cache_hits += num_ext
            num_loaded = self._load(req, num_hit, num_ext) if num_ext else 0
            # What a connector did not load is computed in this step: those blocks are already
            # registered in the prefix cache, so they must hold their K/V by the step's end.
            num_new += num_ext - num_loaded
            req.num_computed_tokens = num_hit + num_loaded
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = num_hit + num_loaded
                self.prompt_tokens_total += req.num_prompt_tokens
                self._step_prompt_tokens += req.num_prompt_tokens
                recomputed = self.kv.num_recomputed_tokens(req, num_hit)
                self.prompt_sources.record(req.num_prompt_tokens, num_hit, num_loaded, recomputed)
            req.status = RequestStatus.RUNNING
            req.record_event(EngineCoreEventType.SCHEDULED, now)
            self.running.append(req)
            scheduled.append(self._scheduled(req, num_new))
            budget -= num_new
        self.num_deferred = skipped
        return budget

    def _connector_tokens(self, req: Request, num_hit: int) -> int | None:
        """Tokens after the pool's hit that the connector supplies, in whole blocks, leaving at least
        one prompt token to compute (None: not known yet, the request waits)."""
        if self.connector is None or req.wants_prompt_logprobs:
            return 0
        num_ext = self.connector.get_num_new_matched_tokens(req, num_hit)
        if num_ext is None:
            return None
        bs = self.kv.block_size
        room = (req.num_tokens - 1) // bs * bs - num_hit
        return max(0, min(num_ext // bs * bs, room))

    def _load(self, req: Request, num_hit: int, num_ext: int) -> int:
        """Has the connector write the blocks of tokens [num_hit, num_hit + num_ext) just allocated;
        returns the tokens loaded (leading whole blocks)."""
        bs = self.kv.block_size
        first, last = num_hit // bs, (num_hit + num_ext) // bs
        hashes = req.update_block_hashes(bs)[first:last]
        n = max(0, min(self.connector.load(req, hashes, req.block_ids[first:last]), last - first))
        self.num_connector_loaded_tokens += n * bs
        return n * bs

    def _drafts_for(self, req: Request, num_new: int, budget: int) -> list[int]:
        """The pending drafts this step verifies: only after a request's last token, within the budget
        and what its limits leave after the target's own token. Unverified drafts are dropped."""
        drafts, req.spec_token_ids = req.spec_token_ids, []
        if not drafts or num_new != 1 or req.num_tokens - req.num_computed_tokens != 1:
            return []
        room = min(
            budget - num_new,
            req.max_tokens - req.num_output_tokens - 1,
            self.max_model_len - req.num_tokens - 1,
        )
        return drafts[: max(room, 0)]

    def _lookahead(self, req: Request, num_scheduled: int) -> int:
        """KV slots a model proposer writes past the scheduled ones, when the step samples."""
        end = req.num_computed_tokens + num_scheduled
        if not self.num_lookahead_slots or end < req.num_tokens:
            return 0
        return max(0, min(self.num_lookahead_slots, self.max_model_len - end))

    def _scheduled(self, req: Request, num_new: int, drafts: list[int] = ()) -> ScheduledRequest:
        start = req.num_computed_tokens
        do_sample = start + num_new == req.num_tokens and req.pooling_params is None
        token_ids = req.all_token_ids[start : start + num_new]
        if drafts:
            token_ids += drafts
        return ScheduledRequest(
            req_id=req.req_id,
            token_ids=token_ids,
            spec_token_ids=list(drafts),
            num_drafts_wanted=self.drafts.wanted(req, len(self.running)) if do_sample else 0,
            num_computed_tokens=start,
            block_ids=list(req.block_ids),
            sampling_params=req.sampling_params,
            do_sample=do_sample,
            output_token_ids=req.output_token_ids,
            prompt_token_ids=req.prompt_token_ids,
            pooling_params=req.pooling_params,
            mm_features=req.mm_features,
            needs_prompt_logprobs=(
                req.wants_prompt_logprobs
                and not req.prompt_logprobs_sent
                and start < req.num_prompt_tokens - 1
            ),
        )

    def _preempt(self, req: Request, now: float) -> None:
        req.status = RequestStatus.PREEMPTED  # before freeing: a connector tells preemption apart
        req.record_event(EngineCoreEventType.PREEMPTED, now)
        self.kv.free(req)
        req.spec_token_ids = []
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    # -- results ---------------------------------------------------------------------------------
    def update_from_output(self, so: SchedulerOutput, out: ModelRunnerOutput) -> list[EngineCoreOutput]:
        results: list[EngineCoreOutput] = []
        now = time.monotonic()  # the step's end: the time of the tokens it brought
        generated = 0  # tokens this step emitted
        for sr in so.scheduled:
            req = self.requests.get(sr.req_id)
            if req is None or req.status is not RequestStatus.RUNNING:
                continue
            req.num_computed_tokens += sr.num_known_tokens
            if sr.pooling_params is not None:
                if req.num_computed_tokens == req.num_tokens:
                    self._finish(req, RequestStatus.FINISHED_STOPPED)
                    results.append(self._core_output(req, [], now, pooled=out.pooled.get(req.req_id)))
                continue
            chunk = out.prompt_logprobs.get(sr.req_id)
            if chunk is not None:
                req.add_prompt_logprobs(*chunk)
            tokens = out.sampled_token_ids.get(sr.req_id)
            if not tokens:
                continue
            accepted = len(tokens) - 1  # the drafts before the target's own token (0 without drafts)
            req.num_computed_tokens += accepted
            logprobs = out.logprobs.get(sr.req_id)
            status = None
            emitted = 0
            for token in tokens:
                req.append_output_token(token)
                emitted += 1
                status = self._check_stop(req, token)
                if status is not None:
                    break
            self.generation_tokens_total += emitted
            generated += emitted
            if sr.spec_token_ids:
                self.drafts.record(req.req_id, len(sr.spec_token_ids), accepted)
                if self.spec_stats is not None:
                    self.spec_stats.record(len(sr.spec_token_ids), accepted, emitted)
            if status is not None:
                self._finish(req, status)
            else:
                req.spec_token_ids = out.spec_token_ids.get(sr.req_id, [])
            core_out = self._core_output(
                req, tokens[:emitted], now, logprobs[:emitted] if logprobs is not None else None
            )
            core_out.prompt_logprobs = req.take_prompt_logprobs()
            results.append(core_out)
        if self._step_prompt_tokens + generated:
            self.iteration_tokens.observe(self._step_prompt_tokens + generated)
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
        # FastDeploy's response_max_tokens: the answer after the reasoning block (reasoning_budget.py).
        if params.response_max_tokens is not None and answer_limit_reached(req.output_token_ids, params):
            return RequestStatus.FINISHED_LENGTH
        return None

    def _core_output(
        self, req: Request, new_ids: list[int], now: float, logprobs=None, pooled=None
    ) -> EngineCoreOutput:
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
            events=req.take_events(),
            timestamp=now,
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
            "kv_connector_loaded_tokens": self.num_connector_loaded_tokens,
            **self.prompt_sources.as_dict(),
            **(self._connector_stats() if self.connector is not None else {}),
            **self.iteration_tokens.as_dict(),
            **(self.spec_stats.as_dict() if self.spec_stats is not None else {}),
        }

    def _connector_stats(self) -> dict:
        return {
            "external_prefix_cache_queries": self.connector_prefix_cache_queries,
            "external_prefix_cache_hits": self.connector_prefix_cache_hits,
        }


class SpecDecodeStats:
    """Speculative decoding's counters (FastDeploy's spec_decode_* metrics, per position as vLLM's)."""

    def __init__(self, num_speculative_tokens: int):
        self.num_drafts = 0  # verifications with at least one draft
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.num_emitted_tokens = 0  # tokens emitted by those verifications
        self.accepted_per_pos = [0] * num_speculative_tokens

    def record(self, drafted: int, accepted: int, emitted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += drafted
        self.num_accepted_tokens += accepted
        self.num_emitted_tokens += emitted
        for j in range(min(accepted, len(self.accepted_per_pos))):
            self.accepted_per_pos[j] += 1

    def as_dict(self) -> dict:
        return {
            "spec_decode_num_drafts": self.num_drafts,
            "spec_decode_num_draft_tokens_total": self.num_draft_tokens,
            "spec_decode_num_accepted_tokens_total": self.num_accepted_tokens,
            "spec_decode_num_emitted_tokens_total": self.num_emitted_tokens,
            "spec_decode_num_accepted_tokens_per_pos": list(self.accepted_per_pos),
        }
