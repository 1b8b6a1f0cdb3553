"""Engine-side pooling: a step's hidden states [T, hidden] → one pooled array per request.

The engine returns *raw* pools (after the model's score head, before normalization, softmax or
matryoshka truncation): those are per-request choices the front end applies with `postprocess`, so a
request's `normalize` / `dimensions` never has to cross the process boundary.

Invariant: every pooled request is scheduled whole in one step (the pooling runner disables chunked
prefill and prefix caching), so rows query_start_loc[b] : query_start_loc[b+1] are the whole prompt.
"""

from __future__ import annotations

import numpy as np

from fdcli_engine.pooling.config import PoolerConfig


def _rows(hidden: np.ndarray, start: int, end: int, pc: PoolerConfig, token_ids) -> np.ndarray:
    """The hidden rows (or the one pooled row) of one sequence, before the head."""
    kind = pc.pooling_type
    if kind == "LAST":
        return hidden[end - 1]
    if kind == "CLS":
        return hidden[start]
    if kind == "MEAN":
        # Every row is a real token (varlen batch: no padding), so the attention-mask-weighted mean of
        # sentence-transformers is the plain mean here. Accumulate in float64 for long prompts.
        return hidden[start:end].mean(axis=0, dtype=np.float64).astype(np.float32)
    if kind == "STEP" and pc.step_tag_id is not None:
        mask = np.asarray(token_ids) == pc.step_tag_id
        return hidden[start:end][mask]
    return hidden[start:end]  # ALL, or STEP without a tag: every position


def pool(
    hidden: np.ndarray, query_start_loc: np.ndarray, token_ids: list[list[int]], pc: PoolerConfig, head=None
):
    """Pooled arrays in batch order. `head` (score head: [N, hidden] float32 → [N, labels]) is applied
    after pooling, which for a linear head equals pooling its per-token outputs."""
    out = []
    for b, ids in enumerate(token_ids):
        start, end = int(query_start_loc[b]), int(query_start_loc[b + 1])
        rows = _rows(hidden, start, end, pc, ids)
        out.append(rows)
    if head is None:
        return out
    # One head call for the whole batch: stack every request's rows, then split them back.
    flat = [r.reshape(-1, r.shape[-1]) for r in out]
    sizes = [f.shape[0] for f in flat]
    scores = head(np.concatenate(flat, axis=0)) if sum(sizes) else np.zeros((0, 1), np.float32)
    pieces = np.split(scores, np.cumsum(sizes)[:-1])
    result = []
    for r, s in zip(out, pieces):
        if r.ndim == 1:
            s = s[0]
        if pc.returned_token_ids is not None and s.shape[-1] > max(pc.returned_token_ids, default=-1):
            s = s[..., pc.returned_token_ids]
        result.append(np.ascontiguousarray(s, dtype=np.float32))
    return result
