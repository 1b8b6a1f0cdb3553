"""Per-request sampling over a batch of logits (numpy, on the host).

Every row is processed with its own request's parameters, so one request's settings never leak into
another's. A request with a `seed` draws from its own generator, advanced exactly once per sampled token:
its tokens are the same whatever else is in the batch and however often it was preempted. Log-probs are
those of the model's raw distribution (before penalties and temperature), as OpenAI reports them.
"""

from __future__ import annotations

import numpy as np

from fdcli_engine.sampling_params import SamplingParams
from fdcli_engine.step_types import ScheduledRequest

_NEG_INF = np.float32(-np.inf)


def log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=-1, keepdims=True)
    z = x - m
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def apply_penalties(
    row: np.ndarray, params: SamplingParams, prompt_ids: list[int], output_ids: list[int]
) -> None:
    if params.repetition_penalty != 1.0:
        seen = np.fromiter(set(prompt_ids) | set(output_ids), dtype=np.int64)
        if seen.size:
            vals = row[seen]
            row[seen] = np.where(vals > 0, vals / params.repetition_penalty, vals * params.repetition_penalty)
    if (params.presence_penalty or params.frequency_penalty) and output_ids:
        ids, counts = np.unique(np.asarray(output_ids, dtype=np.int64), return_counts=True)
        row[ids] -= params.frequency_penalty * counts + params.presence_penalty


def apply_masks(row: np.ndarray, params: SamplingParams, output_ids: list[int], eos_ids: set[int]) -> None:
    if len(output_ids) < params.min_tokens:
        banned = set(params.stop_token_ids) | (set() if params.ignore_eos else eos_ids)
        for t in banned:
            if 0 <= t < row.shape[0]:
                row[t] = _NEG_INF
    for seq in params.bad_words_token_ids:
        if not seq:
            continue
        prefix = seq[:-1]
        if not prefix or (len(output_ids) >= len(prefix) and output_ids[-len(prefix) :] == prefix):
            if 0 <= seq[-1] < row.shape[0]:
                row[seq[-1]] = _NEG_INF


def filter_probs(row: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Temperature, top-k, top-p, min-p; returns normalised probabilities."""
    x = row / np.float32(params.temperature)
    k = params.top_k
    if 0 < k < x.shape[0]:
        kth = np.partition(x, -k)[-k]
        x = np.where(x < kth, _NEG_INF, x)
    x = x - x.max()
    p = np.exp(x)
    p /= p.sum()
    if params.top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        cum = np.cumsum(p[order])
        # Keep the smallest prefix whose mass reaches top_p (always at least the top token).
        cut = int(np.searchsorted(cum, params.top_p, side="left")) + 1
        keep = np.zeros_like(p, dtype=bool)
        keep[order[:cut]] = True
        p = np.where(keep, p, 0.0)
    if params.min_p > 0.0:
        p = np.where(p < params.min_p * p.max(), 0.0, p)
    return p / p.sum()


class Sampler:
    def __init__(self, seed: int = 0, eos_token_ids: set[int] | None = None):
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self.request_rngs: dict[str, np.random.Generator] = {}
        self.eos_token_ids = set(eos_token_ids or ())

    def drop(self, req_ids) -> None:
        for rid in req_ids:
            self.request_rngs.pop(rid, None)

    def _rng_for(self, sr: ScheduledRequest) -> np.random.Generator:
        seed = sr.sampling_params.seed
        if seed is None:
            return self.rng
        rng = self.request_rngs.get(sr.req_id)
        if rng is None:
            rng = self.request_rngs[sr.req_id] = np.random.Generator(np.random.PCG64(seed % 2**64))
        return rng

    def sample(
        self, logits: np.ndarray, reqs: list[ScheduledRequest]
    ) -> tuple[list[int], list[list[tuple[int, float]] | None]]:
        tokens: list[int] = []
        all_logprobs: list[list[tuple[int, float]] | None] = []
        for i, sr in enumerate(reqs):
            params = sr.sampling_params
            raw = logits[i]
            lp = log_softmax(raw) if params.logprobs is not None else None
            row = raw.copy()
            apply_penalties(row, params, sr.prompt_token_ids, sr.output_token_ids)
            apply_masks(row, params, sr.output_token_ids, self.eos_token_ids)
            if params.is_greedy:
                tok = int(np.argmax(row))
            else:
                p = filter_probs(row, params)
                cum = np.cumsum(p)
                u = self._rng_for(sr).random() * cum[-1]
                tok = int(min(np.searchsorted(cum, u, side="right"), p.shape[0] - 1))
            tokens.append(tok)
            all_logprobs.append(self._logprobs(lp, tok, params.logprobs) if lp is not None else None)
        return tokens, all_logprobs

    @staticmethod
    def _logprobs(lp: np.ndarray, tok: int, k: int) -> list[tuple[int, float]]:
        out = [(tok, float(lp[tok]))]
        if k > 0:
            top = np.argpartition(-lp, k)[:k] if k < lp.shape[0] else np.arange(lp.shape[0])
            top = top[np.argsort(-lp[top], kind="stable")]
            out.extend((int(t), float(lp[t])) for t in top)
        return out
