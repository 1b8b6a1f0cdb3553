"""Token embedding and LM head.

The head is stored as [hidden, vocab] so logits are a plain matmul (Paddle's transpose_y path is slower
on CPU: docs/engine-measurements.md). With tied embeddings the head is a transposed copy of the embedding table: memory for speed.
Both accept GGUF blocks (loader.gguf_io.QuantizedTensor, under --quantization gguf). The head keeps them
for the block-quantized linear op, which reads 4x fewer bytes per decode step than the fp32 table for a
Q8_0 head; the embedding reads its rows from the same blocks (`ops.embedding`), so a tied table exists
once, quantized, instead of also as a 4-byte-per-value copy (113 MB for SmolLM2).
"""

from __future__ import annotations

import numpy as np
import paddle
import paddle.nn.functional as F

from fdcli_engine import ops

# GGUF block types whose rows ops.embedding reads without dequantizing the table (Q4_0, Q4_1, Q8_0).
BLOCK_TYPES = (2, 3, 8)


class VocabEmbedding:
    def __init__(self, vocab_size: int, hidden_size: int):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.weight = None  # paddle fp32 [vocab, hidden]
        self.lw = None  # instead of weight: GGUF blocks prepared as a linear op weight [vocab, hidden]

    @property
    def is_loaded(self) -> bool:
        return self.weight is not None or self.lw is not None

    def load(self, weight: np.ndarray) -> None:
        if tuple(weight.shape) != (self.vocab_size, self.hidden_size):
            raise ValueError(
                f"embedding shape {tuple(weight.shape)} != expected ({self.vocab_size}, {self.hidden_size})"
            )
        if getattr(weight, "ggml_type", None) in BLOCK_TYPES:
            self.lw = ops.prepare_linear_gguf(weight.raw, weight.ggml_type, self.hidden_size, None)
            return
        if hasattr(weight, "ggml_type"):
            weight = weight.dequantize()
        self.weight = paddle.to_tensor(np.asarray(weight, dtype=np.float32))

    def __call__(self, input_ids):
        if self.lw is not None:
            return ops.embedding(input_ids, self.lw)
        return F.embedding(input_ids, self.weight)


class LMHead:
    def __init__(self, hidden_size: int, vocab_size: int):
        self.hidden_size = hidden_size
        self.vocab_size = vocab_size
        # The linear op's weight: fp32 panels, or the GGUF blocks as stored. Never Paddle's matmul: its
        # BLAS may split a row's sum differently by row count (MKL does on Intel CPUs), and a logit must
        # not depend on what else the step holds (tests/engine/test_preemption.py).
        self.lw = None

    @property
    def is_loaded(self) -> bool:
        return self.lw is not None

    def load(self, weight: np.ndarray) -> None:
        """weight: [vocab, hidden] as in HF checkpoints (lm_head.weight or the tied embedding)."""
        if tuple(weight.shape) != (self.vocab_size, self.hidden_size):
            raise ValueError(
                f"lm_head shape {tuple(weight.shape)} != expected ({self.vocab_size}, {self.hidden_size})"
            )
        if hasattr(weight, "ggml_type"):
            self.lw = ops.prepare_linear_gguf(weight.raw, weight.ggml_type, self.hidden_size, None)
            return
        self.lw = ops.prepare_linear(np.asarray(weight, dtype=np.float32), None, None)

    def tie(self, embedding: VocabEmbedding, weight: np.ndarray) -> None:
        """Tied to the embedding table `weight`: share its prepared GGUF blocks if it kept them."""
        if embedding.lw is not None:
            self.lw = embedding.lw
        else:
            self.load(weight)

    def __call__(self, hidden):
        return ops.linear(hidden, self.lw)

    def argmax(self, hidden) -> list[int] | None:
        """Each row's first argmax of self(hidden) (ties to the lowest id), the logits never leaving the
        op; None when a row's logits hold a NaN."""
        return ops.linear_argmax(hidden, self.lw)
