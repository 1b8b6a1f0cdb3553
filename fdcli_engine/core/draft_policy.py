"""Which requests draft, and how many drafts: speculative decoding's adaptive switch-off.

A step drafts only while its rows are cheap (ROW_BUDGET, or vLLM's disable_by_batch_size when given),
and a request drafts only when drafting pays: its acceptance over its most recent drafted tokens (at least
WINDOW of them) must stay at or above MIN_ACCEPTANCE, else it pauses for `backoff` steps and then tries
again, the pause doubling each time it fails (up to MAX_BACKOFF) and resetting when it succeeds. So a
workload whose drafts are rarely right soon stops paying for verification, and a request whose text
turns repetitive later still gets drafts. A constrained request drafts too (its draft rows are masked
by the grammar, runner/grammar_masks.py), unless its constraint starts after a trigger (a reasoning
model's end tag), which drafts could straddle.
"""

from __future__ import annotations

from dataclasses import dataclass

from fdcli_engine.request import Request

# Rows a step verifies at little cost: while a CPU decode step reads the weights once for a few rows,
# extra rows are nearly free; in a big batch the step is bound by compute and every rejected draft
# costs what a token does. Without disable_by_batch_size, a step's drafts share ROW_BUDGET minus the
# running requests (one row each): all k drafts for one request, none from ROW_BUDGET requests up.
ROW_BUDGET = 8
WINDOW = 16  # drafted tokens per judgement
MIN_ACCEPTANCE = 0.3  # accepted / drafted over the window
FIRST_BACKOFF = 8  # steps
MAX_BACKOFF = 256


@dataclass
class _Track:
    drafted: int = 0
    accepted: int = 0
    paused: int = 0  # steps left without drafts
    backoff: int = FIRST_BACKOFF


class DraftPolicy:
    def __init__(self, num_speculative_tokens: int, disable_by_batch_size: int | None = None):
        self.k = num_speculative_tokens
        self.disable_by_batch_size = disable_by_batch_size
        self.tracks: dict[str, _Track] = {}

    def wanted(self, req: Request, num_running: int) -> int:
        """Drafts to propose for `req`'s next step (0: none)."""
        params = req.sampling_params
        if not self.k or params is None:
            return 0
        if params.structured_outputs is not None and params.structured_outputs.start_after_token_ids:
            return 0
        if self.disable_by_batch_size is not None:
            if num_running >= self.disable_by_batch_size:
                return 0
            share = self.k
        else:
            share = max(0, ROW_BUDGET - num_running) // max(num_running, 1)
        track = self.tracks.get(req.req_id)
        if track is not None and track.paused:
            track.paused -= 1
            return 0
        return min(self.k, share, max(0, req.max_tokens - req.num_output_tokens - 1))

    def record(self, req_id: str, drafted: int, accepted: int) -> None:
        track = self.tracks.setdefault(req_id, _Track())
        track.drafted += drafted
        track.accepted += accepted
        if track.drafted < WINDOW:
            return
        if track.accepted < MIN_ACCEPTANCE * track.drafted:
            track.paused, track.backoff = track.backoff, min(2 * track.backoff, MAX_BACKOFF)
        else:
            track.backoff = FIRST_BACKOFF
        track.drafted = track.accepted = 0

    def drop(self, req_id: str) -> None:
        self.tracks.pop(req_id, None)
