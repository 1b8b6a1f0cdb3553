"""Draft proposers for speculative decoding: what makes the drafts a step verifies.

A proposer runs after the step's verification (runner/spec_decode.py), on what the step produced, and
returns the drafts of each request's next step. Drafts are point proposals (one token per position, no
distribution): the verification is then exact with a target sample per position (spec_decode.py).

Model proposers (MTP, a draft model) keep their own KV cache in the same block pool: the same block
tables and slot mapping as the target, their own tensors of `num_blocks` blocks. Their invariant: after
every step, the proposer's cache holds K/V for every position the target's holds (the known tokens,
prompt chunks and recomputed ones included, whether or not that request drafts), so a prefix-cache hit or
a preemption needs nothing of them. They may write `num_lookahead_slots` positions beyond the tokens
known after the step (the drafts' own K/V); the scheduler allocates those slots, and a proposer never
writes past the request's block table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fdcli_engine.errors import ConfigError
from fdcli_engine.step_types import ScheduledRequest

if TYPE_CHECKING:
    import paddle

    from fdcli_engine.resolved_config import ResolvedConfig
    from fdcli_engine.runner.input_batch import ModelInputs


@dataclass
class ProposeInputs:
    """One step, as the target ran it."""

    scheduled: list[ScheduledRequest]  # in input order (row spans: inputs.meta.query_start_loc_np)
    inputs: ModelInputs  # the target's inputs: tokens, positions, slot mapping, block tables
    # The target's final hidden states (after its last norm), one row per input; for a proposer that does
    # not feed on them (feeds_hidden False) possibly only the read rows (runner/read_rows.py).
    hidden: paddle.Tensor
    # req_id -> the tokens the step produced (ModelRunnerOutput.sampled_token_ids): the accepted drafts
    # then the target's own token. A request absent here sampled nothing (a prompt chunk mid-prefill).
    sampled: dict[str, list[int]]


class Proposer:
    """The interface; NgramProposer, DraftModelProposer, MTPProposer and EagleProposer implement it."""

    # KV positions past the known tokens a proposer writes per request and step (0: no KV cache).
    num_lookahead_slots: int = 0

    def kv_block_bytes(self, block_size: int, kv_cache_dtype: str) -> int:
        """Bytes one block of the proposer's own KV cache takes (0: it keeps none)."""
        return 0

    def allocate_kv(self, num_blocks: int, block_size: int, kv_cache_dtype: str) -> None:
        """Allocate the proposer's KV cache: `num_blocks` blocks, the target's block ids."""

    def propose(self, step: ProposeInputs) -> dict[str, list[int]]:
        """req_id -> drafts for the next step, at most `ScheduledRequest.num_drafts_wanted` of them
        (requests that want none are absent or empty)."""
        raise NotImplementedError

    def drop(self, req_ids) -> None:
        """Forget per-request state of finished requests."""


def make_proposer(config: ResolvedConfig, target_model) -> Proposer | None:
    """The proposer `config.speculative_config` names, or None without speculation."""
    spec = config.speculative_config
    if spec is None:
        return None
    if spec.method == "ngram":
        from fdcli_engine.runner.ngram_proposer import NgramProposer

        return NgramProposer(spec)
    if spec.method == "draft_model":
        from fdcli_engine.runner.draft_model_proposer import DraftModelProposer

        return DraftModelProposer(config, target_model)
    if spec.method == "mtp":
        from fdcli_engine.runner.mtp_proposer import MTPProposer

        return MTPProposer(config, target_model)
    if spec.method in ("eagle", "eagle3"):
        from fdcli_engine.runner.eagle_proposer import EagleProposer

        return EagleProposer(config, target_model)
    raise ConfigError(f"speculative method {spec.method!r} has no proposer")
