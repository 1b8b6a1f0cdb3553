"""Runs one scheduled step on the model: inputs → forward → logits of the sampling rows → sampler.

With constrained requests in the step, their grammar masks are filled on a worker thread while the
forward runs (runner/grammar_masks.py); a step without any submits nothing."""

from __future__ import annotations

import logging

import numpy as np
import paddle

from fdcli_engine.resolved_config import ResolvedConfig
from fdcli_engine.runner.grammar_masks import GrammarMasks
from fdcli_engine.runner.input_batch import build_inputs
from fdcli_engine.runner.kv_cache import allocate_kv_caches, kv_block_bytes
from fdcli_engine.runner.prompt_logprobs import compute_prompt_logprobs
from fdcli_engine.runner.sampler import Sampler
from fdcli_engine.step_types import ModelRunnerOutput, SchedulerOutput

logger = logging.getLogger(__name__)

GiB = 1 << 30


def num_kv_blocks_for(config: ResolvedConfig, model) -> int:
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    n = int(
        config.kv_cache_memory_gb * GiB // kv_block_bytes(model, config.block_size, config.kv_cache_dtype)
    )
    # Never more than enough for max_num_seqs full-length sequences: memory nobody could use.
    per_seq = -(-config.max_model_len // config.block_size)
    return max(2, min(n, per_seq * config.max_num_seqs))


class ModelRunner:
    def __init__(self, config: ResolvedConfig, model, eos_token_ids: set[int], make_grammar_backend=None):
        self.config = config
        self.model = model
        self.block_size = config.block_size
        self.num_blocks = num_kv_blocks_for(config, model)
        self.kv_caches = allocate_kv_caches(model, self.num_blocks, self.block_size, config.kv_cache_dtype)
        self.sampler = Sampler(seed=config.seed, eos_token_ids=eos_token_ids)
        self.grammar = GrammarMasks(None, eos_token_ids, make_backend=make_grammar_backend)
        logger.info(
            "KV cache: %d blocks of %d tokens, %s (%.2f GiB)",
            self.num_blocks,
            self.block_size,
            config.kv_cache_dtype,
            self.num_blocks * kv_block_bytes(model, self.block_size, config.kv_cache_dtype) / GiB,
        )

    @paddle.no_grad()
    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        self.sampler.drop(so.finished_req_ids)
        self.grammar.drop(so.finished_req_ids)
        if so.is_empty:
            return ModelRunnerOutput(sampled_token_ids={})
        inputs = build_inputs(so.scheduled, self.block_size, mark_prompt_rows=True)
        sample_idx = [i for i, s in enumerate(so.scheduled) if s.do_sample]
        reqs = [so.scheduled[i] for i in sample_idx]
        pending = self.grammar.begin(so.scheduled, reqs)
        try:
            hidden = self.model.forward(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta)
        finally:
            masks = self.grammar.wait(pending)  # the worker never outlives the step
        prompt_logprobs = {}
        if any(s.needs_prompt_logprobs for s in so.scheduled):
            prompt_logprobs = compute_prompt_logprobs(
                self.model, hidden, so.scheduled, inputs.meta.query_start_loc_np
            )
        failed = masks.failed if masks is not None else {}
        if not sample_idx:
            return ModelRunnerOutput(sampled_token_ids={}, prompt_logprobs=prompt_logprobs, failed=failed)
        rows = inputs.last_token_rows[sample_idx]
        if len(rows) == hidden.shape[0]:
            selected = hidden
        else:
            selected = paddle.gather(hidden, paddle.to_tensor(rows.astype(np.int64)))
        logits = self.model.compute_logits(selected).numpy()
        tokens, logprobs = self.sampler.sample(logits, reqs, masks)
        out = ModelRunnerOutput(
            sampled_token_ids={r.req_id: t for r, t in zip(reqs, tokens) if r.req_id not in failed},
            prompt_logprobs=prompt_logprobs,
            failed=failed,
        )
        for r, lp in zip(reqs, logprobs):
            if lp is not None and r.req_id not in failed:
                out.logprobs[r.req_id] = lp
        return out
