"""Vocab-parallel embedding and LM head: each of T ranks holds a run of ceil(vocab / T) token rows.

- `VocabParallelEmbedding`: a rank looks up the ids in its run (others read row 0 and are zeroed), and
  the all-reduce sums the ranks' rows: every id is found on exactly one rank, so the sum is that row
  plus zeros, the exact row.
- `ParallelLMHead`: a rank computes the logits of its run, padded with zero rows to the common length,
  and the all-gather concatenates them in rank order; the padding columns are cut off.
Both keep GGUF blocks as the unsharded layers do (rows of blocks are whole tokens).
"""

from __future__ import annotations

import numpy as np
import paddle

from fdcli_engine.layers import tp_shard
from fdcli_engine.layers.embedding import LMHead, VocabEmbedding


class VocabParallelEmbedding(VocabEmbedding):
    def __init__(self, vocab_size: int, hidden_size: int, group):
        super().__init__(vocab_size, hidden_size)
        self.group = group
        self.start, self.end, _ = tp_shard.padded_part(vocab_size, group.world_size, group.rank)

    def load(self, weight) -> None:
        if tuple(weight.shape) != (self.vocab_size, self.hidden_size):
            raise ValueError(
                f"embedding shape {tuple(weight.shape)} != expected ({self.vocab_size}, {self.hidden_size})"
            )
        full = self.vocab_size
        self.vocab_size = self.end - self.start  # the parent's shape check and table are this run's
        try:
            super().load(tp_shard.rows(weight, self.start, self.end))
        finally:
            self.vocab_size = full

    def __call__(self, input_ids):
        inside = paddle.logical_and(input_ids >= self.start, input_ids < self.end)
        local = paddle.where(inside, input_ids - self.start, paddle.zeros_like(input_ids))
        rows = super().__call__(local)
        rows = rows * inside.astype(rows.dtype).unsqueeze(-1)
        return self.group.all_reduce(rows)


class ParallelLMHead(LMHead):
    def __init__(self, hidden_size: int, vocab_size: int, group):
        super().__init__(hidden_size, vocab_size)
        self.group = group
        self.start, self.end, self.part_size = tp_shard.padded_part(vocab_size, group.world_size, group.rank)

    def load(self, weight) -> None:
        if tuple(weight.shape) != (self.vocab_size, self.hidden_size):
            raise ValueError(
                f"lm_head shape {tuple(weight.shape)} != expected ({self.vocab_size}, {self.hidden_size})"
            )
        part = tp_shard.pad_rows(tp_shard.rows(weight, self.start, self.end), self.part_size)
        full = self.vocab_size
        self.vocab_size = self.part_size
        try:
            super().load(part if tp_shard.is_blocks(part) else np.asarray(part, dtype=np.float32))
        finally:
            self.vocab_size = full

    def tie(self, embedding, weight) -> None:
        # The embedding's run is unpadded: share its blocks only where there is no padding.
        if embedding.lw is not None and self.end - self.start == self.part_size:
            self.lw = embedding.lw
        else:
            self.load(weight)

    def argmax(self, hidden) -> None:
        """Never: a rank holds only its run's logits, and the ranks must join the all-gather."""
        return None

    def __call__(self, hidden):
        logits = self.group.all_gather(super().__call__(hidden), axis=-1)
        if logits.shape[-1] != self.vocab_size:
            logits = logits[..., : self.vocab_size]
        return logits


def vocab_embedding(vocab_size: int, hidden_size: int, group):
    if group is None or group.world_size == 1:
        return VocabEmbedding(vocab_size, hidden_size)
    return VocabParallelEmbedding(vocab_size, hidden_size, group)


def lm_head(hidden_size: int, vocab_size: int, group):
    if group is None or group.world_size == 1:
        return LMHead(hidden_size, vocab_size)
    return ParallelLMHead(hidden_size, vocab_size, group)
