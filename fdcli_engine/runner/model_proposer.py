"""What the model proposers (draft_model_proposer.py, mtp_proposer.py) share: their own KV cache in the
target's block pool, the rows that keep it level with the target's, and the greedy chain of drafts.

After a step, for a request with c = num_computed_tokens: its tokens at positions c, c+1, .. are the
step's known tokens then what the step produced (accepted drafts, then the target's own token). The
target holds K/V for positions [0, L), L = c + num_known_tokens + accepted drafts; the last produced
token sits at position L, without K/V yet. One forward of the proposer's model writes every request's
rows over [c, L) (the invariant of runner/proposer.py, whether or not the request drafts); a subclass
may add the row at L (the draft model does). The last row of a drafting request gives its first draft;
each further draft is one more forward over one row per drafting request, at the next position, up to
`num_lookahead_slots` positions past the known tokens and never past the block table or max_model_len.

Drafts are argmax tokens: point proposals, which the exact verification requires. Nothing is kept per
request between steps: each step's rows come from the step itself, so preemption, prefix-cache hits
and finished requests need nothing here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import paddle

from fdcli_engine.runner.input_batch import build_inputs
from fdcli_engine.runner.kv_cache import allocate_kv_caches, kv_block_bytes
from fdcli_engine.runner.proposer import ProposeInputs, Proposer
from fdcli_engine.step_types import ScheduledRequest


@dataclass
class Rows:
    """One request's rows in a proposer forward, shaped as build_inputs reads a ScheduledRequest."""

    token_ids: list[int]
    num_computed_tokens: int  # position of token_ids[0]
    block_ids: list[int]
    prompt_token_ids: list[int]
    # MTP: the row (of the target's hidden states in the first forward) feeding each row.
    hidden_rows: list[int] = field(default_factory=list)
    num_drafts: int = 0  # drafts this request makes (0: its rows only keep the cache level)


@dataclass
class RequestStep:
    """A request's tokens after the step, as the proposers read them."""

    sr: ScheduledRequest
    first_row: int  # the request's first row in the target's inputs
    tokens: list[int]  # at positions c, c+1, ..: the known tokens of the step, then those it produced
    num_cached: int  # L: positions [0, L) hold the target's K/V
    produced: bool  # the step sampled for it (it may draft)
    limit: int  # first position the proposer must not write (block table end, max_model_len)

    def token_at(self, position: int) -> int | None:
        """The request's token at `position` (>= c), None where it is not known yet."""
        i = position - self.sr.num_computed_tokens
        if i < len(self.tokens):
            return self.tokens[i]
        prompt, output = self.sr.prompt_token_ids, self.sr.output_token_ids
        if self.produced or position >= len(prompt) + len(output):
            return None
        return prompt[position] if position < len(prompt) else output[position - len(prompt)]


class ModelProposer(Proposer):
    """A proposer drafting with a model that keeps its own KV cache (subclasses: the model and rows)."""

    feeds_hidden = False  # the model takes one input hidden state per row (MTP)

    def __init__(self, config, model):
        self.model = model
        self.block_size = config.block_size
        self.max_model_len = config.max_model_len
        self.num_lookahead_slots = config.speculative_config.num_speculative_tokens
        self.kv_caches: list[tuple] | None = None

    def kv_block_bytes(self, block_size: int, kv_cache_dtype: str) -> int:
        return kv_block_bytes(self.model, block_size, kv_cache_dtype)

    def allocate_kv(self, num_blocks: int, block_size: int, kv_cache_dtype: str) -> None:
        self.block_size = block_size
        self.kv_caches = allocate_kv_caches(self.model, num_blocks, block_size, kv_cache_dtype)

    # --- subclass hooks -------------------------------------------------------------------------
    def rows_for(self, rs: RequestStep, wants: int) -> Rows | None:
        """The request's rows in the first forward (None: none), with how many drafts it makes."""
        raise NotImplementedError

    def forward(self, inputs, hidden_in: paddle.Tensor | None) -> paddle.Tensor:
        """The model over `inputs` (hidden_in: one row of input hidden states per row, MTP only)."""
        raise NotImplementedError

    def first_hidden(self, step: ProposeInputs, rows: list[Rows]) -> paddle.Tensor | None:
        """hidden_in of the first forward."""
        return None

    # --- the step -------------------------------------------------------------------------------
    def request_steps(self, step: ProposeInputs) -> list[RequestStep]:
        out = []
        starts = step.inputs.meta.query_start_loc_np
        for i, sr in enumerate(step.scheduled):
            produced = step.sampled.get(sr.req_id)
            known = sr.token_ids[: sr.num_known_tokens]
            c = sr.num_computed_tokens
            num_cached = c + len(known) + (len(produced) - 1 if produced else 0)
            limit = min(len(sr.block_ids) * self.block_size, self.max_model_len)
            tokens = known + produced if produced else known
            out.append(RequestStep(sr, int(starts[i]), tokens, num_cached, produced is not None, limit))
        return out

    @paddle.no_grad()
    def propose(self, step: ProposeInputs) -> dict[str, list[int]]:
        rows: list[Rows] = []
        req_ids: list[str] = []
        for rs in self.request_steps(step):
            r = self.rows_for(rs, rs.sr.num_drafts_wanted if rs.produced else 0)
            if r is not None and r.token_ids:
                rows.append(r)
                req_ids.append(rs.sr.req_id)
        if not rows:
            return {}
        inputs = build_inputs(rows, self.block_size, mark_prompt_rows=True)
        hidden = self.forward(inputs, self.first_hidden(step, rows))
        drafting = [k for k, r in enumerate(rows) if r.num_drafts > 0]
        if not drafting:
            return {}
        last = inputs.last_token_rows[drafting]
        drafts = {k: [t] for k, t in zip(drafting, self._argmax(hidden, last))}
        chain = [rows[k] for k in drafting]
        positions = {k: r.num_computed_tokens + len(r.token_ids) for k, r in zip(drafting, chain)}
        prev_rows = dict(zip(drafting, last.tolist()))  # row of each request's last output
        while True:
            live = [k for k in drafting if len(drafts[k]) < rows[k].num_drafts]
            if not live:
                break
            step_rows = [
                Rows([drafts[k][-1]], positions[k], rows[k].block_ids, rows[k].prompt_token_ids) for k in live
            ]
            inputs = build_inputs(step_rows, self.block_size, mark_prompt_rows=True)
            hidden_in = None
            if self.feeds_hidden:  # each row continues from its request's previous output row
                hidden_in = gather_rows(hidden, [prev_rows[k] for k in live])
            hidden = self.forward(inputs, hidden_in)
            for j, (k, t) in enumerate(zip(live, self._argmax(hidden, inputs.last_token_rows))):
                drafts[k].append(t)
                positions[k] += 1
                prev_rows[k] = j
        return {req_ids[k]: d for k, d in drafts.items()}

    def _argmax(self, hidden: paddle.Tensor, rows) -> list[int]:
        logits = self.model.compute_logits(gather_rows(hidden, rows))
        return paddle.argmax(logits, axis=-1).numpy().tolist()


def gather_rows(hidden: paddle.Tensor, rows) -> paddle.Tensor:
    """hidden[rows], without a copy when that is every row in order."""
    rows = np.asarray(rows, dtype=np.int64)
    if len(rows) == hidden.shape[0] and (rows == np.arange(len(rows))).all():
        return hidden
    return paddle.gather(hidden, paddle.to_tensor(rows))
