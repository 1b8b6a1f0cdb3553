"""A row's result does not depend on what shares its step (#28 item 5: preemption must not change
answers). A preempted request is recomputed as one many-row prefill of its prompt and generated tokens;
those tokens first came from one-row decode steps, batched with whatever else was running. Both kernels
on that path give the bits the decode gave:
- linear: every output element is one FMA chain over k in order, for any row count (the rows of a
  decode batch, a prompt, the K-blocked schedules: from 48 rows, or on AVX2 from 5 rows with the weights
  dequantized into a scratch and the rows in chunks), fp32 and weight-only int8 / int4;
- paged_attention: with the step's prompt_rows, each generated-token query (0 in the mask, after its
  sequence's prompt queries) takes the work items its decode step had, so its output equals that
  decode's exactly, whatever the cache dtype; every prompt query takes the lanes, whose rows do not see
  each other, so prefilling a prompt whole, in chunks, or again after preemption gives the same bits.
Exact equality throughout: the oracle is the same kernel on the one-row (decode) step.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import to_pd
from test_attention_c8 import np_quantize

from fdcli_engine.step_types import AttentionMetadata


@pytest.mark.parametrize("quant", [None, "wint8", "wint4"])
# 640: two K blocks (384 + 256) once 48 rows block K; 1000: two (500 + 500) on AVX2's scratch path, the
# boundary inside a wint4 group. 300 rows: two row chunks there. n = 200: a last panel of 8 columns.
@pytest.mark.parametrize("k", [64, 640, 1000])
def test_linear_rows_are_batch_invariant(native, rng, quant, k):
    n = 200
    w = rng.standard_normal((n, k), dtype=np.float32)
    b = rng.standard_normal(n, dtype=np.float32)
    lw = native.prepare_linear(w, b, quant)
    x = rng.standard_normal((300, k), dtype=np.float32)
    alone = np.stack([native.linear(to_pd(x[i : i + 1]), lw).numpy()[0] for i in range(len(x))])
    for m in (2, 3, 4, 5, 6, 13, 47, 48, 70, 300):
        np.testing.assert_array_equal(native.linear(to_pd(x[:m]), lw).numpy(), alone[:m], err_msg=f"m={m}")


def _meta(q_lens, ctx_lens, tables, prompt_mask=None):
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    lens = np.asarray(ctx_lens, dtype=np.int32)
    width = max(len(t) for t in tables)
    bt = np.zeros((len(tables), width), dtype=np.int32)
    for i, t in enumerate(tables):
        bt[i, : len(t)] = t
    rows = None if prompt_mask is None else to_pd(np.asarray(prompt_mask, dtype=np.uint8))
    return AttentionMetadata(
        slot_mapping=to_pd(np.zeros(int(qsl[-1]), np.int64)),
        query_start_loc=to_pd(qsl),
        seq_lens=to_pd(lens),
        block_tables=to_pd(bt),
        max_query_len=int(max(q_lens)),
        max_seq_len=int(lens.max()),
        block_size=16,
        query_start_loc_np=qsl,
        seq_lens_np=lens,
        prompt_rows=rows,
    )


def _caches(rng, nb, nkv, hd, kv):
    kc = rng.standard_normal((nb, nkv, 16, hd), dtype=np.float32)
    vc = rng.standard_normal((nb, nkv, 16, hd), dtype=np.float32)
    if kv == "c8":
        (kq, ks), (vq, vs) = np_quantize(kc), np_quantize(vc)
        return to_pd(kq), to_pd(vq), (to_pd(ks), to_pd(vs))
    if kv == "bf16":
        return to_pd(kc).astype("bfloat16"), to_pd(vc).astype("bfloat16"), ()
    return to_pd(kc), to_pd(vc), ()


# (prompt length, generated tokens): generated queries inside one lane tile, across tiles, and contexts
# over 256 keys, where the decode path splits keys into parts.
@pytest.mark.parametrize("prompt,generated", [(5, 9), (37, 20), (250, 30)])
@pytest.mark.parametrize("nh,nkv", [(4, 2), (9, 3), (8, 1)])  # GQA groups 2, 3 (decode path) and 8 (lanes)
@pytest.mark.parametrize("kv", ["fp32", "bf16", "c8"])
def test_recomputed_generated_queries_equal_their_decode(native, rng, prompt, generated, nh, nkv, kv):
    hd, total = 64, prompt + generated
    nblocks = -(-total // 16)
    kc, vc, extra = _caches(rng, nblocks + 8, nkv, hd, kv)
    table = list(rng.permutation(nblocks + 8)[:nblocks])
    other = list(rng.permutation(nblocks + 8)[:3])  # a second sequence batched with each decode
    q = rng.standard_normal((total, nh, hd), dtype=np.float32)
    scale = hd**-0.5
    mask = [1] * prompt + [0] * generated
    meta = _meta([total], [total], [table], mask)
    recomputed = native.paged_attention(to_pd(q), kc, vc, meta, scale, *extra).numpy()
    # The original prefill, whole or in two chunks (chunked prefill): the prompt rows' bits do not depend
    # on where a chunk or lane tile starts.
    whole = native.paged_attention(
        to_pd(q[:prompt]), kc, vc, _meta([prompt], [prompt], [table], [1] * prompt), scale, *extra
    )
    np.testing.assert_array_equal(recomputed[:prompt], whole.numpy())
    cut = prompt // 3 + 1
    chunks = [
        native.paged_attention(
            to_pd(q[a:e]), kc, vc, _meta([e - a], [e], [table], [1] * (e - a)), scale, *extra
        )
        for a, e in ((0, cut), (cut, prompt))
    ]
    np.testing.assert_array_equal(recomputed[:prompt], np.concatenate([c.numpy() for c in chunks]))
    q_other = rng.standard_normal((1, nh, hd), dtype=np.float32)
    for i in range(prompt, total):
        batch = np.concatenate([q_other, q[i : i + 1]]) if i % 2 else q[i : i + 1]
        meta = _meta([1, 1], [40, i + 1], [other, table]) if i % 2 else _meta([1], [i + 1], [table])
        decoded = native.paged_attention(to_pd(batch), kc, vc, meta, scale, *extra).numpy()[-1]
        np.testing.assert_array_equal(recomputed[i], decoded, err_msg=f"generated query at position {i}")
