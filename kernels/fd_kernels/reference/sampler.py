"""Reference (numpy) of the batched sampler op `sample`: the oracle for fd_kernels' fused sampler (`fd_sample_host`), and
the engine's sampler when the C++ kernels are unavailable. Row by row, on the host:

1. penalties on a copy of the logits: repetition over the distinct prompt and output tokens (x / r where
   x > 0, else x * r; float32), then `frequency * count + presence` subtracted for each distinct output
   token (computed in float64, as numpy promotes); then banned tokens (min_tokens, bad words) -> -inf;
2. greedy rows (temperature < 1e-5 or top_k == 1, as SamplingParams.is_greedy) -> the first argmax;
3. otherwise x / temperature (float32), top-k (ties at the k-th value kept), softmax, top-p (the most
   likely tokens in stable order, up to and including the first whose running mass reaches
   top_p - TOP_P_SLACK), min-p (p >= min_p * max p), renormalized;
4. the draw: the first token whose running probability exceeds u * total, u the row's last uniform.
With `rejection` (FD_SAMPLING_CLASS=rejection) step 4 is preceded by up to num_uniforms - 1 draws from the
whole temperature distribution (no top-k/top-p/min-p), the first one the filtered distribution keeps
being returned; the exact draw is the fallback. Both give every token the same probability.

Running sums are float64 (float32 ones drift by ~1e-5 over a 49k vocabulary).
TOP_P_SLACK makes a mass that reaches top_p up to float rounding count as reaching it (0.5 + 0.25 for
top_p = 0.75), so the kernel, which sums in another order, keeps the same set at such ties.

Inputs (numpy): logits float32 [B, V]; params float64 [B, len(PARAM_COLUMNS)]; ids int64 [N];
meta int64 [B, len(META_COLUMNS)], the layout of fd_kernels.sampler_layout: row b's ids are
ids[offset : offset + num_prompt + num_output + num_banned] (prompt ids, output ids, banned ids; ids
outside [0, V) are ignored); uniforms float64 [B, num_uniforms] in [0, 1). Returns int64 [B].
"""

from __future__ import annotations

import numpy as np

from fd_kernels.sampler_layout import MetaRow, ParamRow

TOP_P_SLACK = 1e-6
_NEG_INF = np.float32(-np.inf)


def log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=-1, keepdims=True)
    z = x - m
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def is_greedy(temperature: float, top_k: int) -> bool:
    return temperature < 1e-5 or top_k == 1


def _in_vocab(ids: np.ndarray, vocab: int) -> np.ndarray:
    return ids[(ids >= 0) & (ids < vocab)]


def apply_penalties(
    row: np.ndarray,
    repetition: float,
    presence: float,
    frequency: float,
    prompt_ids: np.ndarray,
    output_ids: np.ndarray,
) -> None:
    """In place on a float32 row; ids are int64 arrays."""
    if repetition != 1.0:
        seen = np.unique(_in_vocab(np.concatenate([prompt_ids, output_ids]), row.shape[0]))
        if seen.size:
            vals = row[seen]
            row[seen] = np.where(vals > 0, vals / repetition, vals * repetition)
    if (presence or frequency) and output_ids.size:
        ids, counts = np.unique(_in_vocab(output_ids, row.shape[0]), return_counts=True)
        row[ids] -= frequency * counts + presence


def filter_probs(row: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float) -> np.ndarray:
    """Temperature, top-k, top-p, min-p; returns normalised float32 probabilities."""
    x = row / np.float32(temperature)
    if 0 < top_k < x.shape[0]:
        kth = np.partition(x, -top_k)[-top_k]
        x = np.where(x < kth, _NEG_INF, x)
    x = x - x.max()
    p = np.exp(x)
    p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        cum = np.cumsum(p[order], dtype=np.float64)  # float32 running sums drift by ~1e-5 over 49k terms
        # Keep the smallest prefix whose mass reaches top_p (always at least the top token).
        cut = int(np.searchsorted(cum, top_p - TOP_P_SLACK, side="left")) + 1
        keep = np.zeros_like(p, dtype=bool)
        keep[order[:cut]] = True
        p = np.where(keep, p, 0.0)
    if min_p > 0.0:
        p = np.where(p < min_p * p.max(), 0.0, p)
    return p / p.sum()


def draw(p: np.ndarray, u: float) -> int:
    """The first token whose running probability exceeds u * total."""
    cum = np.cumsum(p, dtype=np.float64)
    return int(min(np.searchsorted(cum, u * cum[-1], side="right"), p.shape[0] - 1))


def sample_row(row: np.ndarray, params: np.ndarray, uniforms: np.ndarray, rejection: bool) -> int:
    """One penalized row (float32, banned tokens already -inf) and its params and uniforms."""
    p = ParamRow(*(float(v) for v in params))
    temperature, top_k, top_p, min_p = p.temperature, int(p.top_k), p.top_p, p.min_p
    if is_greedy(temperature, top_k):
        return int(np.argmax(row))
    if row.max() == _NEG_INF:  # every token banned: nothing to draw from
        return 0
    p = filter_probs(row, temperature, top_k, top_p, min_p)
    if rejection:
        q = filter_probs(row, temperature, 0, 1.0, 0.0)
        for u in uniforms[:-1]:
            tok = draw(q, float(u))
            if p[tok] > 0.0:
                return tok
    return draw(p, float(uniforms[-1]))


def sample(
    logits: np.ndarray,
    params: np.ndarray,
    ids: np.ndarray,
    meta: np.ndarray,
    uniforms: np.ndarray,
    rejection: bool = False,
) -> np.ndarray:
    out = np.empty(logits.shape[0], dtype=np.int64)
    for b in range(logits.shape[0]):
        m = MetaRow(*(int(v) for v in meta[b]))
        off, n_prompt, n_output, n_banned = m.offset, m.num_prompt, m.num_output, m.num_banned
        row = logits[b].astype(np.float32, copy=True)
        p = ParamRow(*(float(v) for v in params[b]))
        rep, presence, frequency = p.repetition_penalty, p.presence_penalty, p.frequency_penalty
        prompt_ids = ids[off : off + n_prompt]
        output_ids = ids[off + n_prompt : off + n_prompt + n_output]
        apply_penalties(row, rep, presence, frequency, prompt_ids, output_ids)
        banned = _in_vocab(
            ids[off + n_prompt + n_output : off + n_prompt + n_output + n_banned], row.shape[0]
        )
        row[banned] = _NEG_INF
        out[b] = sample_row(row, params[b], uniforms[b], rejection)
    return out
