"""The pooling model runner: forward a step's prompts, pool each request's hidden states, no sampling.

KV cache: an encoder (BertModel) attends within the step and caches nothing, so it gets no cache tensors
at all; the scheduler's blocks are then bookkeeping only. A decoder needs a paged cache for the step it
runs in, but never longer (pooling requests finish in the step that computes their prompt and prefix
caching is off), so the cache holds one step's worth of tokens: the token budget plus one partial block
per sequence.
"""

from __future__ import annotations

import logging

import numpy as np
import paddle

from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.pooling.config import get_pooler_config
from fdcli_engine.pooling.pooler import pool
from fdcli_engine.resolved_config import ResolvedConfig
from fdcli_engine.runner.input_batch import build_inputs
from fdcli_engine.runner.mm_inputs import MultiModalInputs
from fdcli_engine.step_types import ModelRunnerOutput, SchedulerOutput

logger = logging.getLogger(__name__)


def _is_encoder(model) -> bool:
    from fdcli_engine.models.bert import BertModel  # noqa: PLC0415

    return isinstance(model, BertModel)


def token_types(scheduled) -> np.ndarray:
    """[T] token types of a step's whole prompts: 1 from each pair's `token_type_start` on, else 0."""
    parts = []
    for s in scheduled:
        types = np.zeros(len(s.token_ids), dtype=np.int64)
        start = s.pooling_params.token_type_start if s.pooling_params is not None else None
        if start is not None:
            types[start:] = 1
        parts.append(types)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


class PoolingModelRunner:
    def __init__(self, config: ResolvedConfig, model):
        self.config = config
        self.model = model
        self.pooler_config = get_pooler_config(config)
        self.block_size = config.block_size
        self.mm = MultiModalInputs(model)  # a vision-language body: image rows and M-RoPE positions
        per_seq = -(-config.max_model_len // config.block_size)
        if _is_encoder(model):
            self.num_blocks = per_seq * config.max_num_seqs
            self.kv_caches: list = []
            logger.info("encoder model: no KV cache")
        else:
            step_blocks = -(-config.max_num_batched_tokens // config.block_size) + config.max_num_seqs
            self.num_blocks = config.num_kv_blocks or max(per_seq, step_blocks)
            shape = [self.num_blocks, model.num_kv_heads, self.block_size, model.head_dim]
            self.kv_caches = [
                (paddle.zeros(shape, dtype="float32"), paddle.zeros(shape, dtype="float32"))
                for _ in range(model.num_layers)
            ]
            logger.info(
                "pooling KV cache: %d blocks of %d tokens (one step)", self.num_blocks, self.block_size
            )

    @paddle.no_grad()
    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        out = ModelRunnerOutput(sampled_token_ids={})
        if so.is_empty:
            return out
        for s in so.scheduled:
            # Invariant kept by resolve_runner (no chunking, no prefix cache): prompts arrive whole.
            if s.num_computed_tokens != 0 or len(s.token_ids) != len(s.prompt_token_ids):
                raise InvalidRequestError(f"pooling request {s.req_id} was not scheduled whole")
        inputs = build_inputs(so.scheduled, self.block_size)
        extra = {}
        if getattr(self.model, "uses_token_types", False):
            extra["token_type_ids"] = token_types(so.scheduled)
        positions, mm_embeds = self.mm.prepare(so.scheduled, inputs.positions, inputs.meta.query_start_loc_np)
        if mm_embeds is not None:
            extra["mm_embeds"] = mm_embeds
        self.mm.drop([s.req_id for s in so.scheduled])  # a pooled request ends in its step
        hidden = self.model.forward(inputs.input_ids, positions, self.kv_caches, inputs.meta, **extra)
        pooled = pool(
            hidden.numpy(),
            inputs.meta.query_start_loc_np,
            [s.token_ids for s in so.scheduled],
            self.pooler_config,
            getattr(self.model, "pooler_head", None),
        )
        out.pooled = {s.req_id: p for s, p in zip(so.scheduled, pooled)}
        return out
