"""Turns the core's token-level outputs into text: incremental detokenization, stop strings, logprobs.

Stop strings are matched on the text, here, because the core knows only tokens; a match finishes the
request here and the caller asks the core to abort it. While a request is running, its last
(longest stop string − 1) characters are held back from streaming, so a stop string is never half
sent before it is recognised. The other stop rules live in the scheduler and the sampler (step_types'
docstring says which). What each output holds is the request's `output_kind`: only DELTA requests'
lists are never accumulated, and only CUMULATIVE ones are copied on every step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from fdcli_engine.outputs import (
    CompletionOutput,
    EngineCoreEventType,
    EngineCoreOutput,
    Logprob,
    PromptLogprobs,
    RequestMetrics,
    RequestOutput,
)
from fdcli_engine.sampling_params import RequestOutputKind, SamplingParams


@dataclass
class _RequestState:
    req_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    detok: object
    index: int = 0
    text: str = ""
    sent: int = 0  # characters of `text` already handed out as deltas
    # All generated ids and logprobs; kept only for CUMULATIVE and FINAL_ONLY outputs.
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] | None = None
    prompt_logprobs: PromptLogprobs | None = None  # once the core has sent them
    cumulative_logprob: float | None = None  # the sampled tokens' logprobs summed (logprobs asked)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
    metrics: RequestMetrics = field(default_factory=lambda: RequestMetrics(time.monotonic()))

    @property
    def holdback(self) -> int:
        return max((len(s) for s in self.params.stop), default=1) - 1

    @property
    def keeps_all(self) -> bool:
        return self.params.output_kind is not RequestOutputKind.DELTA


class OutputProcessor:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.vocab_size
        self.states: dict[str, _RequestState] = {}
        # One-id decodes, per skip_special_tokens, shared by every request's detokenizer (at most one
        # entry per id of the vocabulary).
        self._single_decodes: dict[bool, dict[int, str]] = {True: {}, False: {}}

    def add_request(
        self,
        req_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        index: int = 0,
    ) -> None:
        from fdcli_engine.tokenizer import IncrementalDetokenizer

        skip = bool(params.skip_special_tokens)
        detok = IncrementalDetokenizer(self.tokenizer, prompt_token_ids, skip, self._single_decodes[skip])
        self.states[req_id] = _RequestState(
            req_id,
            prompt,
            list(prompt_token_ids),
            params,
            detok,
            index=index,
            logprobs=[] if params.logprobs is not None else None,
            cumulative_logprob=0.0 if params.logprobs is not None else None,
        )

    def abort(self, req_id: str) -> None:
        self.states.pop(req_id, None)

    def has_request(self, req_id: str) -> bool:
        return req_id in self.states

    def process_outputs(self, outputs: list[EngineCoreOutput]) -> tuple[list[RequestOutput], list[str]]:
        """RequestOutputs (as each request's output_kind asks: FINAL_ONLY requests appear only when
        they finish) and the ids of requests a stop string finished, which the core must abort."""
        results: list[RequestOutput] = []
        to_abort: list[str] = []
        for out in outputs:
            st = self.states.get(out.req_id)
            if st is None:
                continue
            st.num_cached_tokens = out.num_cached_tokens
            new_ids = list(out.new_token_ids)
            new_lps = self._new_logprobs(st, out)
            new_prompt_lps = None
            if out.prompt_logprobs is not None:
                new_prompt_lps = [None] + [self._logprob_dict(e) for e in out.prompt_logprobs]
                st.prompt_logprobs = new_prompt_lps
            keeps_all = st.keeps_all
            if out.events:
                _record_events(st.metrics, out.events)
            if new_ids:
                _record_tokens(st.metrics, len(new_ids), out.timestamp)
                if keeps_all:
                    st.token_ids.extend(new_ids)
            if new_lps:
                # The sampled token is each entry's first (sampler._logprobs): vLLM's running sum.
                st.cumulative_logprob += sum(next(iter(d.values())).logprob for d in new_lps)
                if keeps_all:
                    st.logprobs.extend(new_lps)
            searched = len(st.text)
            text_ids = new_ids
            if out.finish_reason == "stop" and new_ids and not st.params.include_stop_str_in_output:
                # The engine stops only on a stop token (EOS or one of stop_token_ids), the last id;
                # as in vLLM its text is not part of the output unless include_stop_str_in_output
                # (skip_special_tokens alone hid EOS, and never a stop token that is not special).
                text_ids = new_ids[:-1]
            # Ids past the tokenizer's vocabulary (models pad their embedding) decode to nothing.
            known = [t for t in text_ids if t < self.vocab_size]
            if known:
                st.text += st.detok.add_tokens(known)
            if out.finish_reason is not None:
                st.text += st.detok.flush()
            if st.params.stop and out.finish_reason != "abort" and self._match_stop(st, searched):
                if out.finish_reason is None:
                    to_abort.append(out.req_id)
            elif out.finish_reason is not None:
                st.finish_reason, st.stop_reason = out.finish_reason, out.stop_reason
            finished = st.finish_reason is not None
            if finished or st.params.output_kind is not RequestOutputKind.FINAL_ONLY:
                results.append(self._make_output(st, new_ids, new_lps, new_prompt_lps))
            if finished:
                del self.states[out.req_id]
        return results, to_abort

    def _new_logprobs(self, st: _RequestState, out: EngineCoreOutput) -> list[dict[int, Logprob]] | None:
        if st.logprobs is None:
            return None
        return [self._logprob_dict(entry) for entry in out.new_logprobs or ()]

    def _match_stop(self, st: _RequestState, searched: int) -> bool:
        # A new match ends in the text added this step: search from `holdback` characters before it.
        start = max(0, searched - st.holdback)
        best: tuple[int, str] | None = None
        for s in st.params.stop:
            idx = st.text.find(s, start)
            if idx >= 0 and (best is None or idx < best[0]):
                best = (idx, s)
        if best is None:
            return False
        idx, s = best
        st.text = st.text[: idx + len(s)] if st.params.include_stop_str_in_output else st.text[:idx]
        st.finish_reason, st.stop_reason = "stop", s
        return True

    def _make_output(self, st: _RequestState, new_ids: list[int], new_lps, new_prompt_lps) -> RequestOutput:
        finished = st.finish_reason is not None
        end = len(st.text) if finished or not st.params.stop else max(st.sent, len(st.text) - st.holdback)
        delta, st.sent = st.text[st.sent : end], max(st.sent, end)
        kind = st.params.output_kind
        if kind is RequestOutputKind.DELTA:
            text, token_ids, logprobs = delta, new_ids, new_lps
        elif kind is RequestOutputKind.FINAL_ONLY:  # the state ends here: hand its lists over
            text, token_ids, logprobs = st.text, st.token_ids, st.logprobs
            new_ids = st.token_ids
        else:
            text = st.text[:end] if not finished else st.text
            token_ids = list(st.token_ids)
            logprobs = list(st.logprobs) if st.logprobs is not None else None
        comp = CompletionOutput(
            index=st.index,
            text=text,
            token_ids=token_ids,
            finish_reason=st.finish_reason,
            stop_reason=st.stop_reason,
            logprobs=logprobs,
            cumulative_logprob=st.cumulative_logprob,
            delta_text=delta,
            delta_token_ids=new_ids,
        )
        metrics = None
        if finished:
            metrics = st.metrics  # the state ends here: hand it over
            metrics.finished_time = time.monotonic()
        return RequestOutput(
            request_id=st.req_id,
            prompt=st.prompt,
            prompt_token_ids=st.prompt_token_ids,
            outputs=[comp],
            finished=finished,
            num_cached_tokens=st.num_cached_tokens,
            metrics=metrics,
            # DELTA outputs carry them once, in the output they arrive with; the others in every one.
            prompt_logprobs=new_prompt_lps if kind is RequestOutputKind.DELTA else st.prompt_logprobs,
        )

    def _logprob_dict(self, entry) -> dict[int, Logprob]:
        """{token_id: Logprob} of one position's [(token_id, logprob, rank), ...], sampled or prompt."""
        d: dict[int, Logprob] = {}
        for tid, lp, rank in entry:
            if tid not in d:
                text = (
                    self.tokenizer.decode([tid], skip_special_tokens=False) if tid < self.vocab_size else ""
                )
                d[tid] = Logprob(tid, lp, text, rank)
        return d


def _record_events(m: RequestMetrics, events) -> None:
    """The core's events: the first QUEUED and the first SCHEDULED time (a preemption re-schedules a
    request, but its queue time ends when it first ran, as vLLM's). PREEMPTED counts in the core's
    num_preemptions, not here."""
    for e in events:
        if e.type == EngineCoreEventType.QUEUED and not m.queued_ts:
            m.queued_ts = e.timestamp
        elif e.type == EngineCoreEventType.SCHEDULED and not m.scheduled_ts:
            m.scheduled_ts = e.timestamp


def _record_tokens(m: RequestMetrics, num_new: int, core_ts: float) -> None:
    """An output with `num_new` tokens from the step that ended at `core_ts` (the core's clock): the
    front end's first-token time (TTFT), the core's first/last token times, one inter-token gap per
    step after the first."""
    if m.first_token_time is None:
        m.first_token_time = time.monotonic()
        m.first_token_ts = core_ts
    else:
        m.inter_token_latencies.append(core_ts - m.last_token_ts)
    m.last_token_ts = core_ts
    m.num_generation_tokens += num_new
