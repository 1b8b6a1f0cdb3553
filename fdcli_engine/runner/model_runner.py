"""Runs one scheduled step on the model: inputs → forward → logits of the sampling rows → sampler →
(speculative decoding) acceptance and the next drafts. A step that needs only each row's first argmax
(Sampler.argmax_suffices) takes the tokens from the model's fused LM head + argmax instead of the
logits and the sampler: the same tokens. Where every row of such a step samples and nothing else reads
its hidden states, the forward gives them (model.forward_greedy: one op a batch-1 decode step).

With constrained requests in the step, their grammar masks are filled on a worker thread while the
forward runs (runner/grammar_masks.py); a step without any submits nothing. With drafts in the step,
each sampling request has a row per draft (runner/spec_decode.py); the proposer (runner/proposer.py)
then drafts the next step's tokens from what this one produced."""

from __future__ import annotations

import logging

import numpy as np
import paddle

from fdcli_engine.resolved_config import ResolvedConfig
from fdcli_engine.runner.grammar_masks import GrammarMasks
from fdcli_engine.runner.huge_pages import place_on_huge_pages
from fdcli_engine.runner.input_batch import InputBuffers, build_inputs, fresh_tensor
from fdcli_engine.runner.kv_cache import allocate_kv_caches, kv_block_bytes, kv_block_views
from fdcli_engine.runner.mm_inputs import MultiModalInputs
from fdcli_engine.runner.prompt_logprobs import compute_prompt_logprobs
from fdcli_engine.runner.proposer import ProposeInputs, make_proposer
from fdcli_engine.runner.read_rows import step_metadata
from fdcli_engine.runner.sampler import Sampler
from fdcli_engine.runner.spec_decode import accept, sampling_rows
from fdcli_engine.step_types import ModelRunnerOutput, SchedulerOutput

logger = logging.getLogger(__name__)

GiB = 1 << 30


def num_kv_blocks_for(config: ResolvedConfig, model, extra_block_bytes: int = 0) -> int:
    """Blocks of the KV cache; `extra_block_bytes`: what a proposer's own cache adds per block."""
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    block_bytes = kv_block_bytes(model, config.block_size, config.kv_cache_dtype) + extra_block_bytes
    n = int(config.kv_cache_memory_gb * GiB // block_bytes)
    # Never more than enough for max_num_seqs full-length sequences: memory nobody could use.
    per_seq = -(-config.max_model_len // config.block_size)
    return max(2, min(n, per_seq * config.max_num_seqs))


class ModelRunner:
    def __init__(self, config: ResolvedConfig, model, eos_token_ids: set[int], make_grammar_backend=None):
        self.config = config
        self.model = model
        self.block_size = config.block_size
        self.proposer = make_proposer(config, model)
        extra = self.proposer.kv_block_bytes(self.block_size, config.kv_cache_dtype) if self.proposer else 0
        self.num_blocks = num_kv_blocks_for(config, model, extra)
        self.kv_caches = allocate_kv_caches(model, self.num_blocks, self.block_size, config.kv_cache_dtype)
        if self.proposer is not None:
            self.proposer.allocate_kv(self.num_blocks, self.block_size, config.kv_cache_dtype)
        # The weights are final now: the one point where they move onto 2 MB pages (the KV caches were
        # allocated on them).
        self.huge_page_bytes = place_on_huge_pages(model, self.proposer)
        self.sampler = Sampler(seed=config.seed, eos_token_ids=eos_token_ids)
        # Each row's first argmax without the logits (models/decoder.py), for plain greedy steps; with
        # the forward itself where the model can (one op a step).
        self._greedy_tokens = getattr(model, "compute_greedy_tokens", None)
        self._forward_greedy = getattr(model, "forward_greedy", None)
        self.grammar = GrammarMasks(None, eos_token_ids, make_backend=make_grammar_backend)
        self.mm = MultiModalInputs(model)
        self.input_buffers = InputBuffers()  # the step's input tensors, refilled each step
        logger.info(
            "KV cache: %d blocks of %d tokens, %s (%.2f GiB)",
            self.num_blocks,
            self.block_size,
            config.kv_cache_dtype,
            self.num_blocks * kv_block_bytes(model, self.block_size, config.kv_cache_dtype) / GiB,
        )

    def kv_block_views(self):
        """Views of every block's K/V for a KV connector: the target's caches, then a draft model's
        (its K/V at a position must come back with the target's, or its drafts would change)."""
        draft = getattr(self.proposer, "kv_caches", None)
        return kv_block_views([self.kv_caches, draft], self.block_size)

    @paddle.no_grad()
    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        if so.finished_req_ids:  # most steps finish nothing: four calls saved
            self.sampler.drop(so.finished_req_ids)
            self.grammar.drop(so.finished_req_ids)
            self.mm.drop(so.finished_req_ids)
            if self.proposer is not None:
                self.proposer.drop(so.finished_req_ids)
        if so.is_empty:
            return ModelRunnerOutput(sampled_token_ids={})
        inputs = build_inputs(
            so.scheduled, self.block_size, mark_prompt_rows=True, buffers=self.input_buffers
        )
        reqs = [s for s in so.scheduled if s.do_sample]
        last_rows = inputs.last_token_rows  # decode: every request samples, no gather needed
        if len(reqs) != len(so.scheduled):
            last_rows = last_rows[[i for i, s in enumerate(so.scheduled) if s.do_sample]]
        rows, views, starts = sampling_rows(reqs, last_rows)
        positions, mm_embeds = self.mm.prepare(so.scheduled, inputs.positions, inputs.meta.query_start_loc_np)
        extra = {} if mm_embeds is None else {"mm_embeds": mm_embeds}
        stage = fresh_tensor if self.input_buffers is None else self.input_buffers.stage
        meta = step_metadata(inputs.meta, so.scheduled, rows, self.proposer, stage)
        pending = self.grammar.begin(so.scheduled, views)
        prompt_logprobs = any(s.needs_prompt_logprobs for s in so.scheduled)
        tokens = None
        try:
            if self._forward_greedy is not None and self._greedy_forward(
                so, reqs, views, rows, inputs, extra, pending, prompt_logprobs
            ):
                hidden, tokens = self._forward_greedy(inputs.input_ids, positions, self.kv_caches, meta)
            else:
                hidden = self.model.forward(inputs.input_ids, positions, self.kv_caches, meta, **extra)
        finally:
            masks = self.grammar.wait(pending)  # the worker never outlives the step
        if meta.out is not None and hidden.shape[0] != inputs.input_ids.shape[0]:
            # The model returned the kept rows alone (a model returns those or every row).
            rows = np.searchsorted(meta.out.rows.numpy(), rows)
        out = ModelRunnerOutput(sampled_token_ids={}, failed=masks.failed if masks is not None else {})
        if prompt_logprobs:
            out.prompt_logprobs = compute_prompt_logprobs(
                self.model, hidden, so.scheduled, inputs.meta.query_start_loc_np
            )
        if reqs:
            self._sample(hidden, rows, reqs, views, starts, masks, out, tokens)
        if self.proposer is not None:
            step = ProposeInputs(so.scheduled, inputs, hidden, out.sampled_token_ids)
            out.spec_token_ids = self.proposer.propose(step)
        return out

    def _greedy_forward(self, so, reqs, views, rows, inputs, extra, pending, prompt_logprobs) -> bool:
        """Whether the forward may also give the step's tokens (model.forward_greedy): every row of the
        step samples (so the tokens are the hidden rows' in order), by its first argmax alone
        (Sampler.argmax_suffices, no grammar mask), and nothing else reads this step's hidden states
        or logits (no proposer, prompt logprobs or multimodal inputs)."""
        return (
            pending is None
            and self.proposer is None
            and not extra
            and len(reqs) == len(so.scheduled)
            and len(rows) == inputs.input_ids.shape[0]
            and not prompt_logprobs
            and self.sampler.argmax_suffices(views)
        )

    def _sample(self, hidden, rows, reqs, views, starts, masks, out: ModelRunnerOutput, tokens=None) -> None:
        """Sample every row, keep what each request emits (spec_decode.accept), into `out`. `tokens`:
        every row's token already taken with the forward (model.forward_greedy), or None."""
        if len(rows) == hidden.shape[0]:
            selected = hidden
        elif len(rows) == 1:  # a prompt's last row: a view of it, no gather op
            selected = hidden[int(rows[0]) : int(rows[0]) + 1]
        else:
            selected = paddle.gather(hidden, paddle.to_tensor(rows))
        # One row per request: no drafts in the step, so no generator state to keep.
        states = self.sampler.draw_states(reqs) if len(rows) != len(reqs) else {}
        logprobs = None  # no logprobs on the argmax path: no row asks for them
        if tokens is None and self._greedy_tokens is not None and self.sampler.argmax_suffices(views, masks):
            tokens = self._greedy_tokens(selected)  # None: a NaN logit, or a head without the fused op
        if tokens is None:
            # A view, not a copy: the tensor is this step's alone, and the sampler only reads it.
            logits = np.from_dlpack(self.model.compute_logits(selected))
            tokens, logprobs = self.sampler.sample(logits, views, masks)
        for sr, start in zip(reqs, starts):
            if sr.req_id in out.failed:
                continue
            n = len(sr.spec_token_ids) + 1
            emitted = accept(sr, tokens[start : start + n])
            out.sampled_token_ids[sr.req_id] = emitted
            if sr.req_id in states and len(emitted) < n:
                self.sampler.keep_draws(sr.req_id, states[sr.req_id], len(emitted))
            if sr.sampling_params.logprobs is not None:
                out.logprobs[sr.req_id] = logprobs[start : start + len(emitted)]
