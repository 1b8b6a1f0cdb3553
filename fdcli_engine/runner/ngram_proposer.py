"""Prompt-lookup drafting (vLLM's "ngram", FastDeploy's "ngram_match"): the request's own tokens.

The history is the prompt, the output so far and what this step produced. For n from prompt_lookup_max
down to prompt_lookup_min, the history's last n tokens are looked up earlier in it; at the latest
earlier match, the tokens that followed it are the drafts. No model, no KV cache.
"""

from __future__ import annotations

import numpy as np

from fdcli_engine.runner.proposer import ProposeInputs, Proposer
from fdcli_engine.speculative_config import SpeculativeConfig


def ngram_drafts(history: np.ndarray, n_min: int, n_max: int, k: int) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the longest matching suffix."""
    length = int(history.shape[0])
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        span = length - n  # candidate starts 0 .. span-1: each leaves at least one token after it
        match = history[:span] == history[length - n]
        for j in range(1, n):
            if not match.any():
                break
            match &= history[j : span + j] == history[length - n + j]
        hits = np.flatnonzero(match)
        if hits.size:
            start = int(hits[-1]) + n
            return history[start : start + k].tolist()
    return []


class _History:
    """A request's tokens as one int64 array, extended in place (amortized growth)."""

    __slots__ = ("buf", "n")

    def __init__(self, capacity: int):
        self.buf = np.empty(max(capacity, 16), dtype=np.int64)
        self.n = 0

    def extend(self, tokens) -> None:
        tokens = np.asarray(tokens, dtype=np.int64)
        need = self.n + tokens.shape[0]
        if need > self.buf.shape[0]:
            grown = np.empty(max(need, 2 * self.buf.shape[0]), dtype=np.int64)
            grown[: self.n] = self.buf[: self.n]
            self.buf = grown
        self.buf[self.n : need] = tokens
        self.n = need

    def view(self) -> np.ndarray:
        return self.buf[: self.n]


class NgramProposer(Proposer):
    def __init__(self, spec: SpeculativeConfig):
        self.n_min = spec.prompt_lookup_min
        self.n_max = spec.prompt_lookup_max
        self.histories: dict[str, _History] = {}

    def _history(self, sr, produced: list[int]) -> np.ndarray:
        """prompt + output + produced, reusing what was copied in earlier steps."""
        known = len(sr.prompt_token_ids) + len(sr.output_token_ids)
        h = self.histories.get(sr.req_id)
        if h is None or h.n > known + len(produced):
            h = self.histories[sr.req_id] = _History(known + 64)
        if h.n < len(sr.prompt_token_ids):
            h.extend(sr.prompt_token_ids[h.n :])
        if h.n < known:
            h.extend(sr.output_token_ids[h.n - len(sr.prompt_token_ids) :])
        # This step's tokens are not in output_token_ids yet: kept only in the view, not in the buffer,
        # since the scheduler may drop some of them (a stop inside them).
        hist = h.view()
        return np.concatenate([hist, np.asarray(produced, dtype=np.int64)]) if produced else hist

    def propose(self, step: ProposeInputs) -> dict[str, list[int]]:
        drafts = {}
        for sr in step.scheduled:
            produced = step.sampled.get(sr.req_id)
            if not sr.num_drafts_wanted or produced is None:
                continue
            got = ngram_drafts(self._history(sr, produced), self.n_min, self.n_max, sr.num_drafts_wanted)
            if got:
                drafts[sr.req_id] = got
        return drafts

    def drop(self, req_ids) -> None:
        for rid in req_ids:
            self.histories.pop(rid, None)
