"""Turns the core's token-level outputs into text: incremental detokenization, stop strings, logprobs.

Stop strings are matched on the text, here, because the core knows only tokens; a match finishes the
request here and the caller asks the core to abort it. While a request is running, its last
(longest stop string − 1) characters are held back from streaming, so a stop string is never half
sent before it is recognised. The other stop rules live in the scheduler and the sampler (step_types'
docstring says which).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fdcli_engine.outputs import CompletionOutput, EngineCoreOutput, Logprob, RequestOutput
from fdcli_engine.sampling_params import SamplingParams


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
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0

    @property
    def holdback(self) -> int:
        return max((len(s) for s in self.params.stop), default=1) - 1


class OutputProcessor:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.vocab_size
        self.states: dict[str, _RequestState] = {}

    def add_request(
        self,
        req_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        index: int = 0,
    ) -> None:
        from fdcli_engine.tokenizer import IncrementalDetokenizer

        detok = IncrementalDetokenizer(self.tokenizer, prompt_token_ids, params.skip_special_tokens)
        self.states[req_id] = _RequestState(
            req_id,
            prompt,
            list(prompt_token_ids),
            params,
            detok,
            index=index,
            logprobs=[] if params.logprobs is not None else None,
        )

    def abort(self, req_id: str) -> None:
        self.states.pop(req_id, None)

    def has_request(self, req_id: str) -> bool:
        return req_id in self.states

    def process_outputs(self, outputs: list[EngineCoreOutput]) -> tuple[list[RequestOutput], list[str]]:
        results: list[RequestOutput] = []
        to_abort: list[str] = []
        for out in outputs:
            st = self.states.get(out.req_id)
            if st is None:
                continue
            st.num_cached_tokens = out.num_cached_tokens
            new_ids = list(out.new_token_ids)
            st.token_ids.extend(new_ids)
            if st.logprobs is not None and out.new_logprobs:
                for entry in out.new_logprobs:
                    st.logprobs.append(self._logprob_dict(entry))
            # Ids past the tokenizer's vocabulary (models pad their embedding) decode to nothing.
            known = [t for t in new_ids if t < self.vocab_size]
            if known:
                st.text += st.detok.add_tokens(known)
            if out.finish_reason is not None:
                st.text += st.detok.flush()
            if st.params.stop and out.finish_reason != "abort" and self._match_stop(st):
                if out.finish_reason is None:
                    to_abort.append(out.req_id)
            elif out.finish_reason is not None:
                st.finish_reason, st.stop_reason = out.finish_reason, out.stop_reason
            results.append(self._make_output(st, new_ids))
            if st.finish_reason is not None:
                del self.states[out.req_id]
        return results, to_abort

    def _match_stop(self, st: _RequestState) -> bool:
        # Only the tail that new tokens could have completed needs searching.
        start = max(0, st.sent - st.holdback)
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

    def _make_output(self, st: _RequestState, new_ids: list[int]) -> RequestOutput:
        finished = st.finish_reason is not None
        end = len(st.text) if finished or not st.params.stop else max(st.sent, len(st.text) - st.holdback)
        delta, st.sent = st.text[st.sent : end], max(st.sent, end)
        comp = CompletionOutput(
            index=st.index,
            text=st.text[:end] if not finished else st.text,
            token_ids=list(st.token_ids),
            finish_reason=st.finish_reason,
            stop_reason=st.stop_reason,
            logprobs=list(st.logprobs) if st.logprobs is not None else None,
            delta_text=delta,
            delta_token_ids=new_ids,
        )
        return RequestOutput(
            request_id=st.req_id,
            prompt=st.prompt,
            prompt_token_ids=st.prompt_token_ids,
            outputs=[comp],
            finished=finished,
            num_cached_tokens=st.num_cached_tokens,
        )

    def _logprob_dict(self, entry) -> dict[int, Logprob]:
        d: dict[int, Logprob] = {}
        for tid, lp in entry:
            if tid not in d:
                text = (
                    self.tokenizer.decode([tid], skip_special_tokens=False) if tid < self.vocab_size else ""
                )
                d[tid] = Logprob(tid, lp, text)
        return d
