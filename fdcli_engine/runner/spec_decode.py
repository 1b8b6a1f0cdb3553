"""Speculative decoding's verification: the target scores every draft of a step in one forward, and the
sampler decides, per position, what the target itself would have produced.

A request with drafts d_1..d_k has k + 1 sampling rows: the row of its last known token and the row of
each draft. Row j is sampled exactly as a plain decode step would sample the request's next token if
its output already ended with d_1..d_j (`row_views`: the same params, bans, penalties and logit_bias
against that output; its own uniform from the request's generator). The step emits row 0's token, and
row j's while the token before it equalled its draft: the accepted drafts, then the target's token at
the first mismatch (or after the last draft).

Why this is exact: drafts are point proposals (proposer.py). Rejection sampling against a point mass d
accepts d with probability p(d) and otherwise samples p without d, renormalised; drawing x ~ p and
accepting iff x == d has exactly that law, and emitting x on a mismatch is that residual sample. So the
emitted tokens follow the non-speculative distribution, greedy rows are the plain argmax, and a seeded
request draws its j-th token from the j-th uniform of its generator either way: the uniforms of rows
past the first mismatch are given back (`Sampler.keep_draws`), so its tokens do not depend on how many
drafts were rejected. The forward itself is row-invariant (attention runs each generated-token query as
its own decode run; the linears compute each row alike whatever the batch), so a verification row's
logits are the bits a one-token decode step gets.
"""

from __future__ import annotations

import copy

import numpy as np

from fdcli_engine.step_types import ScheduledRequest


def row_views(sr: ScheduledRequest) -> list[ScheduledRequest]:
    """The request's sampling rows: itself, then one view per draft whose output ends with the drafts
    before that row."""
    views = [sr]
    for j in range(1, len(sr.spec_token_ids) + 1):
        view = copy.copy(sr)
        view.output_token_ids = sr.output_token_ids + sr.spec_token_ids[:j]
        views.append(view)
    return views


def sampling_rows(
    reqs: list[ScheduledRequest], last_rows: np.ndarray
) -> tuple[np.ndarray, list[ScheduledRequest], list[int]]:
    """(hidden-state rows to sample, the sampler's per-row requests, where each request's rows start).
    `last_rows[i]`: the row of reqs[i]'s last scheduled token (its last draft, if any)."""
    rows: list[int] = []
    views: list[ScheduledRequest] = []
    starts: list[int] = []
    for sr, last in zip(reqs, last_rows):
        k = len(sr.spec_token_ids)
        starts.append(len(views))
        rows.extend(range(int(last) - k, int(last) + 1))
        views.extend(row_views(sr) if k else (sr,))
    return np.asarray(rows, dtype=np.int64), views, starts


def accept(sr: ScheduledRequest, tokens: list[int]) -> list[int]:
    """The tokens a request emits from its rows' samples: each sample, while it matches its draft."""
    out = []
    for j, token in enumerate(tokens):
        out.append(token)
        if j == len(sr.spec_token_ids) or token != sr.spec_token_ids[j]:
            break
    return out
