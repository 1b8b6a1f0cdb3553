"""The MoE layer with a hand-set router, and the tiny MoE model under wint8/wint4.

Routing case: token t's hidden state is the basis vector e_t, so its router logits are column t of
the gate weight, chosen here so each token's experts are known in advance (one token's choice is
flipped by the correction bias, which must not change its weights). Every expert is wrapped in a spy
that records which tokens it received; the output is checked against a numpy evaluation of
sum_j w_j * expert_j(x).
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest
from ernie_archs import MOE
from test_ernie_models import PROMPT, build_fd
from tiny_models import PagedRunner

from fdcli_engine.layers.moe import MoE, route

H, INTER, E = 8, 4, 4
# Router logits per token (rows) over experts 0..3.
LOGITS = np.array(
    [
        [3.0, 2.0, 0.0, -1.0],  # -> {0, 1}
        [0.0, 0.0, 5.0, 4.0],  # -> {2, 3}
        [1.0, 0.0, 0.0, 1.5],  # probs .30 .11 .11 .49 pick {3, 0}; bias +0.2 on expert 1 -> {3, 1}
        [0.5, 2.0, 2.5, 0.0],  # -> {2, 1}
    ],
    dtype=np.float32,
)
EXPECTED = [{0, 1}, {2, 3}, {1, 3}, {1, 2}]
BIAS = np.array([[0.0, 0.2, 0.0, 0.0]], dtype=np.float32)


def silu(x):
    return x / (1 + np.exp(-x))


class Spy:
    def __init__(self, expert, expert_id, log):
        self.expert, self.expert_id, self.log = expert, expert_id, log

    def __call__(self, rows, prompt_rows=None):
        self.log[self.expert_id] = sorted(int(i) for i in rows.numpy().argmax(axis=1))
        return self.expert(rows, prompt_rows)


@pytest.fixture
def moe_layer():
    rng = np.random.default_rng(0)
    moe = MoE(H, INTER, E, top_k=2, norm_min=1e-12)
    gate = np.zeros((E, H), np.float32)
    gate[:, : len(LOGITS)] = LOGITS.T  # logits(e_t) = gate @ e_t = LOGITS[t]
    moe.gate.load(gate)
    moe.correction_bias.load(BIAS)
    weights = []
    for expert in moe.experts:
        g, u, d = (rng.standard_normal(s).astype(np.float32) for s in [(INTER, H), (INTER, H), (H, INTER)])
        expert.gate_up_proj.load_shard(0, weight=g)
        expert.gate_up_proj.load_shard(1, weight=u)
        expert.down_proj.load_shard(0, weight=d)
        weights.append((g, u, d))
    return moe, weights


def test_hand_set_router_runs_exactly_the_chosen_experts(moe_layer):
    moe, weights = moe_layer
    log: dict[int, list[int]] = {}
    moe.experts = [Spy(ex, i, log) for i, ex in enumerate(moe.experts)]
    x = np.eye(len(LOGITS), H, dtype=np.float32)
    out = moe(paddle.to_tensor(x)).numpy()

    expected_tokens = {e: sorted(t for t, s in enumerate(EXPECTED) if e in s) for e in range(E)}
    assert log == {e: toks for e, toks in expected_tokens.items() if toks}

    probs = np.exp(LOGITS) / np.exp(LOGITS).sum(axis=1, keepdims=True)
    ref = np.zeros_like(x)
    for t, chosen in enumerate(EXPECTED):
        w = np.array([probs[t, e] for e in sorted(chosen)])
        w = w / w.sum()  # weights from the probabilities without the bias
        for wj, e in zip(w, sorted(chosen), strict=True):
            g, u, d = weights[e]
            ref[t] += wj * (d @ (silu(g @ x[t]) * (u @ x[t])))
    np.testing.assert_allclose(out, ref, atol=1e-5, rtol=1e-5)


def test_unrouted_experts_are_not_run(moe_layer):
    moe, _ = moe_layer
    log: dict[int, list[int]] = {}
    moe.experts = [Spy(ex, i, log) for i, ex in enumerate(moe.experts)]
    moe(paddle.to_tensor(np.eye(1, H, dtype=np.float32)))  # token 0 only: experts 0 and 1
    assert log == {0: [0], 1: [0]}


def test_route_normalisation_floor():
    # All selected probabilities tiny relative to norm_min: the sum is floored, not divided by ~0.
    selected, weights = route(np.zeros((1, 4), np.float32), 2, np.zeros(4, np.float32), norm_min=10.0)
    assert len(set(selected[0].tolist())) == 2
    np.testing.assert_allclose(weights, [[0.025, 0.025]])


# Quantized tiny MoE vs fp32: relative L2 error of the prefill logits. Measured on this checkpoint:
# wint8 2.7%, wint4 (experts 4-bit, the rest 8-bit) 6.9% (a few router top-k choices flip, which
# amplifies weight rounding in a 64-wide model). The bounds leave margin yet catch an unquantized
# path (error 0) or a broken one (~100%).
QUANT_BOUNDS = {"wint8": (1e-3, 0.05), "wint4": (1e-2, 0.15)}


@pytest.fixture(scope="module")
def fp32_logits(ernie_checkpoint):
    return PagedRunner(build_fd(ernie_checkpoint(MOE), MOE)).step([("s", PROMPT)])


@pytest.mark.parametrize("quant", ["wint8", "wint4"])
def test_quantized_moe_logits_close_to_fp32(ernie_checkpoint, fp32_logits, quant):
    model = build_fd(ernie_checkpoint(MOE), MOE, quantization=quant)
    moe = model.layers[1].mlp
    dense_quant = "wint8"  # FastDeploy's wint4 on ERNIE MoE: experts 4-bit, everything else 8-bit
    assert moe.experts[0].gate_up_proj.lw.quantization == quant
    assert moe.shared_experts.down_proj.lw.quantization == dense_quant
    assert model.layers[0].self_attn.qkv_proj.lw.quantization == dense_quant
    assert model.layers[0].mlp.gate_up_proj.lw.quantization == dense_quant
    got = PagedRunner(model).step([("s", PROMPT)])
    rel = np.linalg.norm(got - fp32_logits) / np.linalg.norm(fp32_logits)
    lo, hi = QUANT_BOUNDS[quant]
    assert lo < rel < hi, f"{quant}: relative logit error {rel:.4f} outside ({lo}, {hi})"


def test_expert_parallel_halves_sum_to_the_whole(moe_layer):
    """The sharding hook: two MoE layers holding experts {0,1} and {2,3} (same router) compute
    partial outputs whose sum (the all-reduce an expert-parallel setup would do) is the full output."""
    moe, _ = moe_layer
    x = paddle.to_tensor(np.eye(len(LOGITS), H, dtype=np.float32))
    full = moe(x).numpy()
    parts = []
    for local in (range(0, 2), range(2, 4)):
        part = MoE(H, INTER, E, top_k=2, local_experts=local)
        part.gate, part.correction_bias = moe.gate, moe.correction_bias
        part.experts = [moe.experts[e] if e in local else None for e in range(E)]
        parts.append(part(x).numpy())
    assert not np.allclose(parts[0], 0) and not np.allclose(parts[1], 0)
    np.testing.assert_allclose(parts[0] + parts[1], full, atol=1e-6)
