"""Typed hand-offs between the scheduler (core/), the model runner (runner/) and the models.

The scheduler and the runner know each other only through these types. Leaf module: paddle appears in
annotations only.

Where a request stops (the one description; the modules named refer here):
- Limits before anything runs: `request_limits.check_request` refuses a prompt that is empty, holds ids
  outside the vocabulary, or leaves no room under max_model_len, and a max_tokens that does not fit;
  `request_limits.max_output_tokens` fixes how many tokens the request may generate (Request.max_tokens).
- Token-level stops, in the scheduler (`core/scheduler.Scheduler._check_stop`), after each sampled token:
  EOS (unless ignore_eos) and stop_token_ids, both only once min_tokens tokens are out ("stop"); then the
  length stop, Request.max_tokens or max_model_len reached, or FastDeploy's response_max_tokens answer
  tokens out after the reasoning block (`reasoning_budget.answer_limit_reached`) ("length").
- Stop strings, in the front end (`output_processor.OutputProcessor`): matched on the detokenized text,
  which the core never sees; a match finishes the request there and the front end asks the core to abort.
- Bans, in the sampler (`runner/sampler.banned_token_ids`): before min_tokens, stop and EOS tokens cannot
  be sampled; a bad word's last token cannot follow its prefix. They shape what is sampled, never stop.
- Grammar masks (structured outputs), in the sampler too, before the bans: a finished grammar allows only
  EOS, and where the bans would leave a constrained row nothing they are lifted (the grammar wins; under
  min_tokens the scheduler then goes on until min_tokens, the extra tokens being EOS).
- A reasoning budget, in the sampler: once spent, the end of the reasoning block is forced token by token
  (`reasoning_budget.forced_token`); it shapes what is sampled, never stops.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import paddle

    from fdcli_engine.multimodal.inputs import MultiModalFeature
    from fdcli_engine.pooling_params import PoolingParams
    from fdcli_engine.sampling_params import SamplingParams


@dataclass
class ScheduledRequest:
    """One request's share of a step."""

    req_id: str
    # Tokens whose K/V this step computes: all_token_ids[num_computed_tokens : num_computed_tokens + n].
    token_ids: list[int]
    num_computed_tokens: int  # position of token_ids[0]
    block_ids: list[int]  # the request's whole block table after this step's allocation
    sampling_params: SamplingParams | None  # None for a pooling request
    # True when this step reaches the end of the known tokens, so a new token is sampled.
    do_sample: bool
    # Generated tokens so far (penalties, seeded generators); shared list, read-only for the runner.
    output_token_ids: list[int] = field(default_factory=list)
    prompt_token_ids: list[int] = field(default_factory=list)
    pooling_params: PoolingParams | None = None  # set: a pooling request (pooled, never sampled)
    # The request asks for prompt logprobs the core has not yet collected: the runner computes those of
    # this chunk's prompt rows (runner/prompt_logprobs.py).
    needs_prompt_logprobs: bool = False
    # Speculative decoding: the drafts this step verifies, the last len(spec_token_ids) entries of
    # token_ids (never in all_token_ids: a draft becomes a token only once the target accepts it). The
    # runner samples at the row before each draft and after the last one (runner/spec_decode.py).
    spec_token_ids: list[int] = field(default_factory=list)
    # How many drafts the proposer should make for the next step (0: none; the scheduler's adaptive
    # switch-off and limits decide it).
    num_drafts_wanted: int = 0
    # The request's images (Request.mm_features, shared, read-only): each owns the placeholder range
    # prompt_token_ids[offset : offset + length], whose rows the runner fills with the vision encoder's
    # output wherever this step's tokens overlap it (runner/mm_inputs.py). Empty: a text request.
    mm_features: list[MultiModalFeature] = field(default_factory=list)

    @property
    def num_known_tokens(self) -> int:
        """Scheduled tokens that are the request's own (not drafts)."""
        return len(self.token_ids) - len(self.spec_token_ids)


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest]
    num_scheduled_tokens: int
    # Requests that finished or were aborted since the last step: the runner drops any per-request state
    # it keeps for them (seeded generators, grammar matchers). A preempted request is not in it: it keeps
    # its output tokens and comes back.
    finished_req_ids: set[str] = field(default_factory=set)
    num_preempted: int = 0

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass
class ModelRunnerOutput:
    # req_id -> the tokens this step produced, only for requests with do_sample: one, or with drafts the
    # accepted drafts and then the target's own token (1 .. len(spec_token_ids) + 1). The scheduler
    # appends them in order and stops at the first stop, dropping the rest.
    sampled_token_ids: dict[str, list[int]]
    # req_id -> per produced token, [(token_id, logprob, rank), ...]: that token first, then its top-k.
    logprobs: dict[str, list[list[tuple[int, float, int]]]] = field(default_factory=dict)
    # req_id -> (first prompt position covered, [[(token_id, logprob, rank), ...] per position]): the
    # prompt logprobs of this step's chunk, for requests with needs_prompt_logprobs.
    prompt_logprobs: dict[str, tuple[int, list[list[tuple[int, float, int]]]]] = field(default_factory=dict)
    # req_id -> pooled output (pooling runner only).
    pooled: dict[str, np.ndarray] = field(default_factory=dict)
    # req_id -> reason: requests the runner cannot go on with (a constraint that failed to compile);
    # no token is reported for them and the engine ends them (finish_reason "abort").
    failed: dict[str, str] = field(default_factory=dict)
    # Speculative decoding: req_id -> the drafts proposed for its next step (ScheduledRequest.
    # num_drafts_wanted at most), verified then.
    spec_token_ids: dict[str, list[int]] = field(default_factory=dict)


@dataclass
class AttentionMetadata:
    """Flattened (varlen) batch description for paged attention. Sequences are laid out one after another
    in the token dimension T; sequence b owns tokens query_start_loc[b] : query_start_loc[b+1]."""

    slot_mapping: paddle.Tensor  # int64 [T]: block_id * block_size + offset where each token's K/V goes
    query_start_loc: paddle.Tensor  # int32 [B+1]
    seq_lens: paddle.Tensor  # int32 [B]: context length after this step (cached + new tokens)
    block_tables: paddle.Tensor  # int32 [B, max_blocks]; unused entries are 0
    max_query_len: int
    max_seq_len: int
    block_size: int
    # Host copies of the same, for code that loops on the CPU side.
    query_start_loc_np: np.ndarray
    seq_lens_np: np.ndarray
    # uint8 [T]: 1 on rows holding a prompt token; None when the step has none. The linears take it
    # (ops.linear: bf16 prompt rows on AMX and AVX512-BF16 CPUs).
    prompt_rows: paddle.Tensor | None = None
    # The rows whose final hidden state is read (runner/read_rows.py), described alone by a metadata of
    # their own whose `rows` holds their indices in this step (int64 [K]). None: every row may be read.
    # A model that honours it returns those K rows only (models/decoder.py decode_layers).
    out: AttentionMetadata | None = None
    rows: paddle.Tensor | None = None

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens_np.shape[0])

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1
