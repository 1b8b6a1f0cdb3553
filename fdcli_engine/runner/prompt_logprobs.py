"""Prompt logprobs (SamplingParams.prompt_logprobs): the LM head and log-softmax on the prompt rows of
the requests that ask, chunk by chunk as chunked prefill schedules them; other requests pay nothing.

The row at position p predicts the token at p + 1, so a chunk covering positions [start, start + n)
yields the logprobs of prompt positions start + 1 .. min(start + n, P) - 1 (P: the prompt length); the
row of position P - 1 predicts the first generated token and belongs to the sampler. Each position's
entry is [(prompt token id, logprob, rank), (top-1 id, logprob, 1), ..., (top-k id, logprob, k)], ranks
as vLLM counts them (1 + the number of tokens with a strictly higher logprob).
"""

from __future__ import annotations

import numpy as np
import paddle
from fd_kernels.reference.sampler import log_softmax

from fdcli_engine.step_types import ScheduledRequest

# Rows through the LM head at once: bounds the [rows, vocab] logits a long prompt chunk would need.
ROWS_PER_SLICE = 256

PromptLogprobEntry = list[tuple[int, float, int]]


def prompt_logprob_rows(s: ScheduledRequest, first_row: int) -> tuple[np.ndarray, list[int], int]:
    """(rows of the flattened batch, the prompt tokens they predict, the first predicted position)."""
    start = s.num_computed_tokens
    n = min(len(s.token_ids), len(s.prompt_token_ids) - 1 - start)
    if n <= 0:
        return np.empty(0, dtype=np.int64), [], start + 1
    return first_row + np.arange(n, dtype=np.int64), s.prompt_token_ids[start + 1 : start + 1 + n], start + 1


def entries_from_logprobs(lp: np.ndarray, targets: list[int], k: int) -> list[PromptLogprobEntry]:
    """One entry per row of `lp` ([rows, vocab] log-probabilities) for the token in `targets`."""
    rows = np.arange(len(targets))
    target_ids = np.asarray(targets, dtype=np.int64)
    target_lp = lp[rows, target_ids]
    ranks = (lp > target_lp[:, None]).sum(axis=1) + 1
    if k > 0:
        k = min(k, lp.shape[1])
        top = np.argpartition(-lp, k - 1, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(lp, top, axis=1), axis=1, kind="stable")
        top = np.take_along_axis(top, order, axis=1)
        top_lp = np.take_along_axis(lp, top, axis=1)
    out = []
    for r in rows:
        entry = [(int(target_ids[r]), float(target_lp[r]), int(ranks[r]))]
        if k > 0:
            entry.extend((int(t), float(v), j + 1) for j, (t, v) in enumerate(zip(top[r], top_lp[r])))
        out.append(entry)
    return out


def compute_prompt_logprobs(
    model, hidden: paddle.Tensor, scheduled: list[ScheduledRequest], query_start_loc: np.ndarray
) -> dict[str, tuple[int, list[PromptLogprobEntry]]]:
    """req_id -> (first prompt position covered, its entries in order) for each scheduled request with
    `needs_prompt_logprobs` whose chunk holds prompt rows."""
    result: dict[str, tuple[int, list[PromptLogprobEntry]]] = {}
    for i, s in enumerate(scheduled):
        if not s.needs_prompt_logprobs:
            continue
        rows, targets, first = prompt_logprob_rows(s, int(query_start_loc[i]))
        if not targets:
            continue
        k = s.sampling_params.prompt_logprobs
        entries: list[PromptLogprobEntry] = []
        for a in range(0, len(rows), ROWS_PER_SLICE):
            part = paddle.to_tensor(rows[a : a + ROWS_PER_SLICE])
            logits = model.compute_logits(paddle.gather(hidden, part)).numpy().astype(np.float32)
            entries += entries_from_logprobs(log_softmax(logits), targets[a : a + ROWS_PER_SLICE], k)
        result[s.req_id] = (first, entries)
    return result
