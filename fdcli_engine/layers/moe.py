"""Mixture-of-experts FFN (ERNIE-4.5 style): a top-k router with an optional score-correction bias,
routed experts that are gated MLPs, and optional shared experts that every token goes through.

Routing (the ERNIE-4.5 / transformers semantics):
    probs    = softmax(x @ W_gate)                       over all experts, fp32
    selected = top_k(probs + correction_bias)            the bias only changes *which* experts win
    weights  = probs[selected] / max(sum(probs[selected]), norm_min)
    out      = sum_j weights_j * expert_{selected_j}(x) (+ shared_experts(x))

Only experts that at least one token of the batch routes to are computed: tokens are sorted by expert
so each hit expert runs one matmul over its contiguous slice of rows, and the weighted results are
scattered back with one index_add. No token is ever dropped (no expert capacity at inference).

Every expert matmul goes through `ops.prepare_linear` / `ops.linear` (via GatedMLP), so weight-only
quantization applies to experts exactly as to dense layers. The router stays fp32: it is tiny and its
top-k is sensitive to rounding.

Over a tensor-parallel group of T ranks (the router and the routing are the same on every rank: the
same input bits, the same fp32 router):
- with expert parallel (`--enable-expert-parallel`), rank r holds the whole experts
  r*E/T .. (r+1)*E/T - 1 (`local_experts`) and computes only the rows routed to them;
- without it, every rank holds every expert's run of intermediate features (column/row parallel).
Either way each rank's routed output is a partial sum, as is its shard of the shared experts (always
intermediate-parallel), and one all-reduce per MoE layer adds them up.
"""

from __future__ import annotations

import numpy as np
import paddle

from fdcli_engine.layers.activation import GatedMLP


class RouterGate:
    """The router projection, stored [hidden, num_experts] fp32. `load` takes the HF layout
    [num_experts, hidden]."""

    def __init__(self, hidden_size: int, num_experts: int):
        self.shape = (num_experts, hidden_size)
        self.weight = None

    @property
    def is_loaded(self) -> bool:
        return self.weight is not None

    def load(self, weight: np.ndarray) -> None:
        if tuple(weight.shape) != self.shape:
            raise ValueError(f"router weight shape {tuple(weight.shape)} != expected {self.shape}")
        self.weight = paddle.to_tensor(np.ascontiguousarray(np.asarray(weight, dtype=np.float32).T))


class CorrectionBias:
    """Per-expert bias added to the routing probabilities for expert *selection* only (ERNIE's
    `moe_statics.e_score_correction_bias`, stored [1, num_experts]). Zero until loaded."""

    def __init__(self, num_experts: int):
        self.num_experts = num_experts
        self.value = np.zeros(num_experts, dtype=np.float32)

    def load(self, weight: np.ndarray) -> None:
        if int(np.asarray(weight).size) != self.num_experts:
            raise ValueError(
                f"correction bias shape {tuple(weight.shape)} != expected (1, {self.num_experts})"
            )
        self.value = np.asarray(weight, dtype=np.float32).reshape(self.num_experts)


def route(router_logits: np.ndarray, top_k: int, bias: np.ndarray, norm_min: float):
    """(selected expert ids int64 [T, k], their normalized weights fp32 [T, k]) from router logits
    [T, E]. Pure numpy on a small array: cheaper than a chain of eager Paddle ops."""
    logits = router_logits.astype(np.float32, copy=False)
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs = shifted / shifted.sum(axis=-1, keepdims=True)
    scores = probs + bias
    # argpartition picks the k best in O(E); their internal order does not matter for the sum.
    selected = np.argpartition(-scores, top_k - 1, axis=-1)[:, :top_k]
    weights = np.take_along_axis(probs, selected, axis=-1)
    weights = weights / np.maximum(weights.sum(axis=-1, keepdims=True), norm_min)
    return selected.astype(np.int64), weights.astype(np.float32)


class MoE:
    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        num_experts: int,
        top_k: int,
        num_shared_experts: int = 0,
        norm_min: float = 1e-12,
        quantization=None,
        shared_quantization=None,
        local_experts: range | None = None,
        group=None,
        expert_parallel: bool = False,
    ):
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k {top_k} must be between 1 and num_experts {num_experts}")
        self.hidden_size = hidden_size
        self.num_experts = num_experts
        self.top_k = top_k
        self.norm_min = float(norm_min)
        self.gate = RouterGate(hidden_size, num_experts)
        self.correction_bias = CorrectionBias(num_experts)
        self.group = group if group is not None and group.world_size > 1 else None
        expert_group = self.group
        if self.group is not None and expert_parallel:
            if num_experts % self.group.world_size:
                raise ValueError(
                    f"{num_experts} experts do not divide by tensor-parallel size {self.group.world_size}"
                )
            per = num_experts // self.group.world_size
            local_experts = range(self.group.rank * per, (self.group.rank + 1) * per)
            expert_group = None  # whole experts: no split inside them
        self.local_experts = local_experts if local_experts is not None else range(num_experts)
        # None for experts held by another rank (expert parallel).
        self.experts: list[GatedMLP | None] = [
            GatedMLP(hidden_size, intermediate_size, quantization, expert_group, reduce=False)
            if e in self.local_experts
            else None
            for e in range(num_experts)
        ]
        self.shared_experts = (
            GatedMLP(
                hidden_size,
                intermediate_size * num_shared_experts,
                shared_quantization,
                self.group,
                reduce=False,
            )
            if num_shared_experts > 0
            else None
        )

    def route(self, x: paddle.Tensor):
        logits = paddle.matmul(x, self.gate.weight)
        return route(logits.numpy(), self.top_k, self.correction_bias.value, self.norm_min)

    def __call__(self, x: paddle.Tensor, prompt_rows=None) -> paddle.Tensor:
        """`prompt_rows` (the step's, see ops.linear) reaches every expert; an expert over a routed subset
        of other length computes it on its usual path."""
        selected, weights = self.route(x)
        out = self._routed(x, selected, weights, prompt_rows)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x, prompt_rows)
        return self.group.all_reduce(out) if self.group is not None else out

    def _routed(
        self, x: paddle.Tensor, selected: np.ndarray, weights: np.ndarray, prompt_rows
    ) -> paddle.Tensor:
        num_tokens = selected.shape[0]
        if num_tokens == 1 and len(self.local_experts) == self.num_experts:
            return self._routed_one_token(x, selected[0], weights, prompt_rows)
        flat_experts = selected.reshape(-1)
        # Stable sort by expert: each expert's (token, slot) pairs become one contiguous run of rows.
        order = np.argsort(flat_experts, kind="stable")
        token_of_row = (order // self.top_k).astype(np.int64)
        weight_of_row = weights.reshape(-1)[order]
        counts = np.bincount(flat_experts, minlength=self.num_experts)
        local = np.zeros(self.num_experts, dtype=bool)
        local[list(self.local_experts)] = True
        if not local.all():  # expert parallel: rows of other ranks' experts are not computed here
            keep = local[flat_experts[order]]
            token_of_row, weight_of_row = token_of_row[keep], weight_of_row[keep]
            counts = np.where(local, counts, 0)
        out = paddle.zeros([num_tokens, self.hidden_size], dtype=x.dtype)
        if token_of_row.size == 0:
            return out
        hit = np.nonzero(counts)[0]
        token_index = paddle.to_tensor(token_of_row)
        rows = paddle.gather(x, token_index)
        # One split op rather than a slice per hit expert (each eager op costs a few microseconds).
        chunks = paddle.split(rows, [int(counts[e]) for e in hit]) if len(hit) > 1 else [rows]
        pieces = [self.experts[e](chunk, prompt_rows) for e, chunk in zip(hit, chunks, strict=True)]
        expert_out = pieces[0] if len(pieces) == 1 else paddle.concat(pieces, axis=0)
        expert_out = expert_out * paddle.to_tensor(weight_of_row[:, None])
        return paddle.index_add(out, token_index, 0, expert_out)

    def _routed_one_token(
        self, x: paddle.Tensor, experts: np.ndarray, weights: np.ndarray, prompt_rows
    ) -> paddle.Tensor:
        """Batch-1 decode: every chosen expert sees the same row, so no sort, gather or scatter; the
        weighted sum is one [1, k] x [k, hidden] matmul."""
        pieces = [self.experts[e](x, prompt_rows) for e in experts]
        return paddle.matmul(paddle.to_tensor(weights), paddle.concat(pieces, axis=0))
