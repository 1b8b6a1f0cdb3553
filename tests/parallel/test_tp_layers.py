"""Sharded layers against the unsharded ones, the ranks as threads of this process (tp_threads.py).

Oracle: the same layer built without tensor parallelism on the same weights. Tolerance: fp32 layers
agree to 1e-5 relative (only the order of the partial sums differs); a vocab-parallel embedding is
exact (a row plus zeros); wint8 / wint4 / GGUF shards hold the codes the whole weight has, so they
agree to the same 1e-5.
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest
from ops_backend import switched_ops
from tp_threads import build_ranks, run_ranks

from fdcli_engine.distributed import tp_group
from fdcli_engine.layers import GatedMLP
from fdcli_engine.layers.linear import Linear, MergedLinear
from fdcli_engine.layers.moe import MoE
from fdcli_engine.layers.tp_embedding import lm_head, vocab_embedding
from fdcli_engine.layers.tp_linear import ColumnParallelLinear, RowParallelLinear

RTOL = 1e-5


def _rng_w(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32) * 0.2


def _blocks(w: np.ndarray, qtype: str):
    """GGUF blocks of `w` as the loader hands them (gguf_io.QuantizedTensor)."""
    import gguf

    from fdcli_engine.loader.gguf_io import QuantizedTensor

    t = getattr(gguf.GGMLQuantizationType, qtype)
    return QuantizedTensor(gguf.quants.quantize(w, t), int(t), tuple(w.shape))


def _weight(w, fmt):
    return _blocks(w, fmt) if fmt.startswith("Q") else w


def _quant(fmt):
    return fmt if fmt in ("wint8", "wint4") else None


@pytest.fixture(params=["native", "reference"])
def backend(request):
    yield from switched_ops(request.param)


@pytest.mark.parametrize("fmt", ["fp32", "wint8", "wint4", "Q8_0", "Q4_0", "Q4_1"])
def test_column_then_row_parallel_equal_unsharded(fmt, backend):
    rng = np.random.default_rng(0)
    hidden, inter = 64, 256  # inter / 2 = 128: whole GGUF blocks and wint4 groups per rank
    w_gu = [_rng_w(rng, inter, hidden) for _ in range(2)]
    w_down = _rng_w(rng, hidden, inter)
    x = paddle.to_tensor(_rng_w(rng, 5, hidden))

    def build():
        mlp = GatedMLP(hidden, inter, _quant(fmt), tp_group())
        for i, w in enumerate(w_gu):
            mlp.gate_up_proj.load_shard(i, _weight(w, fmt))
        mlp.down_proj.load_shard(0, _weight(w_down, fmt))
        return mlp

    (ref,) = build_ranks(1, build)
    ranks = build_ranks(2, build)
    assert isinstance(ranks[0].gate_up_proj, ColumnParallelLinear)
    assert isinstance(ranks[1].down_proj, RowParallelLinear)
    want = ref(x).numpy()
    got = run_ranks([lambda m=m: m(x).numpy() for m in ranks])
    np.testing.assert_allclose(got[0], want, rtol=RTOL, atol=RTOL * np.abs(want).max())
    np.testing.assert_array_equal(got[0], got[1])  # every rank gets the same bits


def test_qkv_split_by_kv_head_keeps_each_heads_rows():
    rng = np.random.default_rng(1)
    hidden, hd, nh, nkv = 32, 8, 4, 2
    ws = [_rng_w(rng, n * hd, hidden) for n in (nh, nkv, nkv)]
    biases = [_rng_w(rng, n * hd) for n in (nh, nkv, nkv)]
    x = paddle.to_tensor(_rng_w(rng, 3, hidden))

    def build():
        lin = MergedLinear(hidden, [nh * hd, nkv * hd, nkv * hd], True)
        if tp_group().world_size > 1:
            lin = ColumnParallelLinear(hidden, [nh * hd, nkv * hd, nkv * hd], True, None, tp_group())
        for i, (w, b) in enumerate(zip(ws, biases)):
            lin.load_shard(i, w, b)
        return lin

    (ref,) = build_ranks(1, build)
    full = ref(x).numpy()
    q, k, v = np.split(full, [nh * hd, (nh + nkv) * hd], axis=-1)
    for r, lin in enumerate(build_ranks(2, build)):
        got = lin(x).numpy()
        gq, gk, gv = np.split(got, [nh // 2 * hd, (nh // 2 + nkv // 2) * hd], axis=-1)
        # Rank r: query heads 2r, 2r+1 and KV head r (the one those heads attend with).
        np.testing.assert_allclose(gq, q[:, r * 2 * hd : (r + 1) * 2 * hd], rtol=RTOL, atol=1e-6)
        np.testing.assert_allclose(gk, k[:, r * hd : (r + 1) * hd], rtol=RTOL, atol=1e-6)
        np.testing.assert_allclose(gv, v[:, r * hd : (r + 1) * hd], rtol=RTOL, atol=1e-6)


def test_row_parallel_bias_counted_once():
    rng = np.random.default_rng(2)
    w, b = _rng_w(rng, 8, 16), _rng_w(rng, 8)
    x = paddle.to_tensor(_rng_w(rng, 2, 16))
    want = Linear(16, 8, True)
    want.load_shard(0, w, b)

    def build():
        lin = RowParallelLinear(16, 8, True, None, tp_group())
        lin.load_shard(0, w, b)
        return lin

    ranks = build_ranks(2, build)
    # Each rank's input is its run of the features (what a column-parallel layer before it leaves).
    got = run_ranks([lambda r=r, m=m: m(x[:, r * 8 : (r + 1) * 8]).numpy() for r, m in enumerate(ranks)])
    np.testing.assert_allclose(got[0], want(x).numpy(), rtol=RTOL, atol=1e-6)


def test_gguf_blocks_refuse_a_split_inside_a_block():
    w = _blocks(np.ones((4, 64), dtype=np.float32), "Q8_0")

    def build():
        lin = RowParallelLinear(64, 4, False, None, tp_group())
        with pytest.raises(ValueError, match="whole blocks"):
            lin.load_shard(0, w)
        return lin

    build_ranks(4, build)  # 16 input features per rank: half a block


@pytest.mark.parametrize("fmt", ["fp32", "Q8_0"])
@pytest.mark.parametrize("vocab", [512, 509])  # 509: the last rank's run is padded
def test_vocab_parallel_embedding_and_lm_head(fmt, vocab):
    rng = np.random.default_rng(3)
    hidden = 64
    table = _rng_w(rng, vocab, hidden)
    ids = paddle.to_tensor(np.array([0, 5, vocab - 1, 300, 255, 256], dtype=np.int64))
    h = paddle.to_tensor(_rng_w(rng, 3, hidden))

    def build():
        emb, head = vocab_embedding(vocab, hidden, tp_group()), lm_head(hidden, vocab, tp_group())
        emb.load(_weight(table, fmt))
        head.tie(emb, _weight(table, fmt))
        return emb, head

    ((emb, head),) = build_ranks(1, build)
    want_rows, want_logits = emb(ids).numpy(), head(h).numpy()
    got = run_ranks([lambda e=e, hd=hd: (e(ids).numpy(), hd(h).numpy()) for e, hd in build_ranks(2, build)])
    for rows, logits in got:
        np.testing.assert_array_equal(rows, want_rows)
        assert logits.shape == (3, vocab)
        np.testing.assert_allclose(logits, want_logits, rtol=RTOL, atol=1e-5)


@pytest.mark.parametrize("expert_parallel", [False, True])
def test_moe_sharded_equal_unsharded(expert_parallel):
    rng = np.random.default_rng(4)
    hidden, inter, experts = 32, 64, 4
    gate = _rng_w(rng, experts, hidden)
    mlps = [
        [_rng_w(rng, inter, hidden), _rng_w(rng, inter, hidden), _rng_w(rng, hidden, inter)] for _ in range(5)
    ]
    x = paddle.to_tensor(_rng_w(rng, 7, hidden))
    local_sets = []

    def build():
        moe = MoE(hidden, inter, experts, 2, 1, group=tp_group(), expert_parallel=expert_parallel)
        moe.gate.load(gate)
        local_sets.append(list(moe.local_experts))
        for e, (g, u, d) in enumerate(mlps[:experts]):
            if e in moe.local_experts:
                moe.experts[e].gate_up_proj.load_shard(0, g)
                moe.experts[e].gate_up_proj.load_shard(1, u)
                moe.experts[e].down_proj.load_shard(0, d)
        g, u, d = mlps[experts]
        moe.shared_experts.gate_up_proj.load_shard(0, g)
        moe.shared_experts.gate_up_proj.load_shard(1, u)
        moe.shared_experts.down_proj.load_shard(0, d)
        return moe

    (ref,) = build_ranks(1, build)
    ranks = build_ranks(2, build)
    if expert_parallel:
        assert local_sets[1:] == [[0, 1], [2, 3]]
    want = ref(x).numpy()
    for rows in (x, x[:1]):  # a batch and the one-token path
        got = run_ranks([lambda m=m, rows=rows: m(rows).numpy() for m in ranks])
        np.testing.assert_allclose(got[0], ref(rows).numpy(), rtol=RTOL, atol=1e-5)
        np.testing.assert_array_equal(got[0], got[1])
    assert want.shape == (7, hidden)
