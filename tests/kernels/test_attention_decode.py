"""The decode path of paged_attention (one or a few query rows per KV head: attend_rows in attn_impl.h)
against the pure-Paddle reference, fp32, bf16 and C8 caches; bf16 also against the fp32 kernel on the
widened values (test_attention.py), which on AVX-512 checks dots16 / pv_rows widening in registers.

The decode path takes keys in chunks of up to 64 made of sub-chunks of up to 16 inside a block: dot
products per sub-chunk (AVX-512: 16 keys at once, the C8 codes transposed in registers), one vectorized
base-2 online-softmax update per chunk, and one P x V pass over the chunk for all rows of a GQA group, in
groups of up to 4 rows (bf16 values widened as even / odd halves, the accumulators put back in dim order
at the end). The sweep covers what those steps special-case: contexts just before, at and after 16-key,
64-key and block boundaries (partial last sub-chunks and chunks), block sizes that are and are not
multiples of 16 (chunks of many short sub-chunks), GQA groups 1, 3, 6, 7 and 8 (row groups of 4 plus a remainder), head sizes that are
multiples of 64 and not (the transposition's masked tail), batches of 1 and 19, and queries of two
tokens (rows of one work item with different causal limits). Contexts over 256 keys are split into parts
of 256 (kKeysPerPart) computed as separate work items and combined: contexts at and around the part
edges, and a row whose last part holds none of its keys. Tolerance as in test_attention.py: 2e-5
absolute (online vs two-pass softmax in fp32). test_isa.py re-runs this file under every lower ISA.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import to_pd
from test_attention import bf16_caches, check_bf16_against_fp32_kernel, make_batch
from test_attention_c8 import np_quantize

from fdcli_engine.step_types import AttentionMetadata

CTX = [1, 5, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 128, 129, 255, 256, 257, 513, 640]
KV = ["fp32", "bf16", "c8"]


def _caches(kc, vc, kv):
    """The fp32 caches as `kv` stores them, and the C8 scales (paged_attention's extra arguments)."""
    if kv == "c8":
        (kq, ks), (vq, vs) = np_quantize(kc.numpy()), np_quantize(vc.numpy())
        return to_pd(kq), to_pd(vq), (to_pd(ks), to_pd(vs))
    if kv == "bf16":
        return (*bf16_caches(kc, vc), ())
    return kc, vc, ()


def _run(native, ref, rng, q_lens, ctx_lens, nh, nkv, bs, hd, kv, qmul=1.0):
    q, kc, vc, meta = make_batch(rng, q_lens, ctx_lens, nh, nkv, hd, bs, np.int32)
    q = q * qmul
    scale = hd**-0.5
    kc, vc, extra = _caches(kc, vc, kv)
    got = native.paged_attention(q, kc, vc, meta, scale, *extra).numpy()
    want = ref.paged_attention(q, kc, vc, meta, scale, *extra).numpy()
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)
    if kv == "bf16":
        check_bf16_against_fp32_kernel(native, q, kc, vc, meta, scale, got)


@pytest.mark.parametrize("kv", KV)
@pytest.mark.parametrize("nh,nkv", [(3, 3), (9, 3), (12, 2), (14, 2), (16, 2)])
@pytest.mark.parametrize("bs,hd", [(16, 64), (32, 128), (16, 80), (8, 48), (5, 24)])
def test_decode_batch_matches_reference(native, ref, rng, kv, nh, nkv, bs, hd):
    # 19 sequences, one query each, every context of CTX: batch 17 and all the chunk/block edges at once.
    _run(native, ref, rng, [1] * len(CTX), CTX, nh, nkv, bs, hd, kv)


@pytest.mark.parametrize("kv", KV)
@pytest.mark.parametrize("ctx", [1, 16, 17, 640])
def test_single_sequence(native, ref, rng, kv, ctx):
    _run(native, ref, rng, [1], [ctx], 9, 3, 16, 64, kv)


@pytest.mark.parametrize("kv", KV)
@pytest.mark.parametrize("bs,hd", [(16, 64), (32, 64), (8, 64), (16, 48)])
def test_two_token_queries(native, ref, rng, kv, bs, hd):
    # 2 queries x group 3 = 6 rows, below the lane path's threshold on AVX-512: one decode work item whose
    # rows see one key apart. At contexts 17 and 33 the first query's rows stop one key before the end of
    # the chunk; at 65 and 129 the last chunk holds only the second query's key, so the first query's rows
    # sit that chunk out; at 257 they sit out the whole second 256-key part.
    _run(native, ref, rng, [2, 2, 2, 2, 2, 2, 2], [17, 33, 2, 257, 300, 65, 129], 9, 3, bs, hd, kv)


@pytest.mark.parametrize("kv", KV)
def test_split_contexts_do_not_depend_on_the_batch(native, rng, kv):
    # The parts depend on a sequence's own context, so its decode output is bit for bit the same alone
    # and among others (whatever the thread count spreads where).
    q, kc, vc, meta = make_batch(rng, [1, 1, 1, 1], [700, 3, 300, 257], 9, 3, 64, 16, np.int32)
    kc, vc, extra = _caches(kc, vc, kv)
    batched = native.paged_attention(q, kc, vc, meta, 0.125, *extra).numpy()
    for b in range(4):
        one = AttentionMetadata(
            slot_mapping=to_pd(np.zeros(1, np.int64)),
            query_start_loc=to_pd(np.array([0, 1], np.int32)),
            seq_lens=meta.seq_lens[b : b + 1],
            block_tables=meta.block_tables[b : b + 1],
            max_query_len=1,
            max_seq_len=int(meta.seq_lens_np[b]),
            block_size=16,
            query_start_loc_np=np.array([0, 1], np.int32),
            seq_lens_np=meta.seq_lens_np[b : b + 1],
        )
        alone = native.paged_attention(q[b : b + 1], kc, vc, one, 0.125, *extra).numpy()
        np.testing.assert_array_equal(alone[0], batched[b])


@pytest.mark.parametrize("kv", KV)
def test_large_logits(native, ref, rng, kv):
    # Scores of +-50 and more: the running max moves often and exp underflows for most keys.
    _run(native, ref, rng, [1] * 6, [16, 17, 100, 257, 600, 1000], 9, 3, 16, 64, kv, qmul=8.0)


@pytest.mark.parametrize("kv", KV)
@pytest.mark.parametrize("bs", [16, 32])
def test_stale_slots_past_the_context_are_ignored(native, ref, rng, kv, bs):
    # The AVX-512 decode path reads whole 16-key chunks, including slots past the context in the last
    # block. Whatever they hold (here NaN / inf values, NaN scales) must not reach the output: the kernel on
    # the poisoned cache equals the reference on a clean one.
    q_lens, ctx_lens, nh, nkv, hd = [1, 1, 1], [1, 20, 47], 9, 3, 64
    q, kc, vc, meta = make_batch(rng, q_lens, ctx_lens, nh, nkv, hd, bs, np.int32)
    bt = meta.block_tables.numpy()
    used = np.zeros(kc.shape[0] * bs, dtype=bool)  # slot = block * bs + offset
    for b, ctx in enumerate(ctx_lens):
        pos = np.arange(ctx)
        used[bt[b, pos // bs] * bs + pos % bs] = True
    stale = ~used.reshape(kc.shape[0], bs)  # [nb, bs]
    k, v = kc.numpy(), vc.numpy()
    k[stale.nonzero()[0], :, stale.nonzero()[1]] = 0.0
    v[stale.nonzero()[0], :, stale.nonzero()[1]] = 0.0
    scale = hd**-0.5
    if kv == "c8":
        (kq, ks), (vq, vs) = np_quantize(k), np_quantize(v)
        want = ref.paged_attention(q, to_pd(kq), to_pd(vq), meta, scale, to_pd(ks), to_pd(vs)).numpy()
        kq[stale.nonzero()[0], :, stale.nonzero()[1]] = -127
        for s in (ks, vs):
            s[stale.nonzero()[0], :, stale.nonzero()[1]] = np.nan
        got = native.paged_attention(q, to_pd(kq), to_pd(vq), meta, scale, to_pd(ks), to_pd(vs)).numpy()
    elif kv == "bf16":
        kb, vb = bf16_caches(to_pd(k), to_pd(v))
        want = ref.paged_attention(q, kb, vb, meta, scale).numpy()
        kbits, vbits = kb.view("uint16").numpy(), vb.view("uint16").numpy()
        kbits[stale.nonzero()[0], :, stale.nonzero()[1]] = 0x7FC0  # NaN
        vbits[stale.nonzero()[0], :, stale.nonzero()[1]] = 0x7F80  # inf
        kb, vb = to_pd(kbits).view("bfloat16"), to_pd(vbits).view("bfloat16")
        got = native.paged_attention(q, kb, vb, meta, scale).numpy()
    else:
        want = ref.paged_attention(q, to_pd(k), to_pd(v), meta, scale).numpy()
        k[stale.nonzero()[0], :, stale.nonzero()[1]] = np.nan
        v[stale.nonzero()[0], :, stale.nonzero()[1]] = np.inf
        got = native.paged_attention(q, to_pd(k), to_pd(v), meta, scale).numpy()
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)
