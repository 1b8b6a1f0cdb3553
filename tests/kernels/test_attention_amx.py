"""Prompt-row attention on AMX tiles (csrc/attn_amx.h): rows marked in prompt_rows over a bf16 cache, on
the AMX level, head_dim a multiple of 64. An fp32 cache keeps fp32 attention.

Oracle: dense causal attention in float64 on q and on the cache's bf16 keys and values. The kernel
keeps q and the probabilities as two bf16 terms each (about 16 bits), so an output may move by about
2^-16 of the largest |v| it averages, plus fp32 rounding; the bound is 1e-4 of it plus 1e-5. The check
also asserts that the bits are not the lane path's (else the test would not show the tiles ran), and
that a prompt row's bits do not depend on its batch, its tile or where a prefill chunk boundary fell.

A lane's running max moves only when a chunk's maximum passes it by more than 8 (base 2); the rising
cases make some rows' scores climb far past that over later chunks while the rows beside them fall, so
both the rescale pass and its skipping run in one tile."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import to_pd
from test_attention import widened

from fdcli_engine.step_types import AttentionMetadata


@pytest.fixture(autouse=True)
def amx_only(native):
    if native.active_isa() != "amx":
        pytest.skip("the CPU (or FD_KERNELS_ISA) does not select the AMX level")


def _meta(bt, q_lens, ctx_lens, bs, marked=True):
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int64)
    lens = np.asarray(ctx_lens, dtype=np.int64)
    t = int(qsl[-1])
    return AttentionMetadata(
        slot_mapping=to_pd(np.zeros(t, np.int64)),
        query_start_loc=to_pd(qsl),
        seq_lens=to_pd(lens),
        block_tables=to_pd(np.asarray(bt, dtype=np.int64)),
        max_query_len=int(max(q_lens)),
        max_seq_len=int(max(ctx_lens)),
        block_size=bs,
        query_start_loc_np=qsl.astype(np.int32),
        seq_lens_np=lens.astype(np.int32),
        prompt_rows=to_pd(np.ones(t, np.uint8)) if marked else None,
    )


def _pool(rng, ctx_lens, nkv, hd, bs, kv):
    max_blocks = max(-(-c // bs) for c in ctx_lens)
    nb = len(ctx_lens) * max_blocks + 2
    bt = rng.permutation(nb)[: len(ctx_lens) * max_blocks].reshape(len(ctx_lens), max_blocks)
    kc = to_pd(rng.standard_normal((nb, nkv, bs, hd), dtype=np.float32))
    vc = to_pd(rng.standard_normal((nb, nkv, bs, hd), dtype=np.float32))
    if kv == "bfloat16":
        kc, vc = kc.astype("bfloat16"), vc.astype("bfloat16")
    return bt, kc, vc


def _dense(q, kc, vc, bt, q_lens, ctx_lens, bs, scale):
    """float64 causal attention on the cache's values, and each output row's bound."""
    k32, v32 = (widened(c) if "bfloat16" in str(c.dtype) else c.numpy() for c in (kc, vc))
    qb = q.astype(np.float64)
    nh, nkv = q.shape[1], k32.shape[1]
    out, bound = np.zeros(q.shape), np.zeros(q.shape[:2])
    t0 = 0
    for b, (nq, ctx) in enumerate(zip(q_lens, ctx_lens)):
        pos = np.arange(ctx)
        k = k32[bt[b][pos // bs], :, pos % bs].astype(np.float64)  # [ctx, nkv, hd]
        v = v32[bt[b][pos // bs], :, pos % bs].astype(np.float64)
        last = ctx - nq + np.arange(nq)
        for h in range(nh):
            g = h // (nh // nkv)
            s = qb[t0 : t0 + nq, h] @ k[:, g].T * scale  # [nq, ctx]
            s[pos[None, :] > last[:, None]] = -np.inf
            p = np.exp(s - s.max(axis=1, keepdims=True))
            out[t0 : t0 + nq, h] = p @ v[:, g] / p.sum(axis=1, keepdims=True)
            bound[t0 : t0 + nq, h] = [np.abs(v[: j + 1, g]).max() for j in last]
        t0 += nq
    return out, bound


@pytest.mark.parametrize("nh,nkv", [(9, 3), (8, 2), (4, 4)])
@pytest.mark.parametrize("bs,hd", [(16, 64), (5, 64), (16, 128)])
def test_prompt_rows_are_bf16_attention(native, rng, nh, nkv, bs, hd, kv="bfloat16"):
    # A prefill, a chunked prefill over a cached prefix, and a short prompt, in one step.
    q_lens, ctx_lens = [70, 30, 3], [70, 100, 3]
    bt, kc, vc = _pool(rng, ctx_lens, nkv, hd, bs, kv)
    q = rng.standard_normal((sum(q_lens), nh, hd), dtype=np.float32)
    scale = hd**-0.5
    got = native.paged_attention(to_pd(q), kc, vc, _meta(bt, q_lens, ctx_lens, bs), scale).numpy()
    want, bound = _dense(q, kc, vc, bt, q_lens, ctx_lens, bs, scale)
    err = np.abs(got - want) - (1e-4 * bound[..., None] + 1e-5)
    assert err.max() <= 0, err.max()
    lane = native.paged_attention(
        to_pd(q), kc, vc, _meta(bt, q_lens, ctx_lens, bs, marked=False), scale
    ).numpy()
    assert (got != lane).any()


def _rising_keys(rng, kc, bt, n, bs):
    """The keys pushed along one unit direction u in proportion to their position, and u: a query with a
    large +u part sees its scores climb by ~40-80 nats over the prompt (its max moves in many chunks), one
    with a -u part sees them fall (its max stays where the first chunk put it)."""
    u = rng.standard_normal(kc.shape[-1]).astype(np.float32)
    u /= np.linalg.norm(u)
    k = kc.astype("float32").numpy()
    pos = np.arange(n)
    k[bt[0][pos // bs], :, pos % bs] += (80.0 * pos / n)[:, None, None] * u
    return to_pd(k).astype("bfloat16"), u


@pytest.mark.parametrize("nh,nkv,hd", [(9, 3, 64), (8, 2, 128)])
def test_rising_scores_rescale_only_their_rows(native, rng, nh, nkv, hd, bs=16, n=300):
    bt, kc, vc = _pool(rng, [n], nkv, hd, bs, "bfloat16")
    kc, u = _rising_keys(rng, kc, bt, n, bs)
    q0 = rng.standard_normal((n, nh, hd), dtype=np.float32)
    falling = np.arange(n) % 3 == 0  # every third row, so every tile holds both kinds

    def run(signs):
        q = (q0 + 6.0 * signs[:, None, None] * u).astype(np.float32)
        return q, native.paged_attention(to_pd(q), kc, vc, _meta(bt, [n], [n], bs), hd**-0.5).numpy()

    q, got = run(np.where(falling, -1.0, 1.0).astype(np.float32))
    want, bound = _dense(q, kc, vc, bt, [n], [n], bs, hd**-0.5)
    err = np.abs(got - want) - (1e-4 * bound[..., None] + 1e-5)
    assert err.max() <= 0, err.max()
    # The rising rows again with their falling neighbours rising too: a row's bits do not depend on
    # whether the other lanes of its tile moved their max.
    _, all_up = run(np.ones(n, np.float32))
    np.testing.assert_array_equal(all_up[~falling], got[~falling])


def test_an_fp32_cache_keeps_fp32_attention(native, ref, rng):
    q_lens, ctx_lens, bs, hd = [70, 30], [70, 100], 16, 64
    bt, kc, vc = _pool(rng, ctx_lens, 3, hd, bs, "float32")
    q = to_pd(rng.standard_normal((sum(q_lens), 9, hd), dtype=np.float32))
    meta = _meta(bt, q_lens, ctx_lens, bs)
    got = native.paged_attention(q, kc, vc, meta, hd**-0.5).numpy()
    np.testing.assert_allclose(got, ref.paged_attention(q, kc, vc, meta, hd**-0.5).numpy(), atol=2e-5, rtol=0)


def test_a_prompt_row_does_not_depend_on_its_batch_or_chunk(native, rng, kv="bfloat16"):
    nh, nkv, hd, bs, n = 9, 3, 64, 16, 150
    bt, kc, vc = _pool(rng, [n, 40], nkv, hd, bs, kv)
    q = rng.standard_normal((n + 40, nh, hd), dtype=np.float32)
    scale = hd**-0.5
    whole = native.paged_attention(to_pd(q[:n]), kc, vc, _meta(bt[:1], [n], [n], bs), scale).numpy()
    # The same prompt beside another one (other tiles, other work split) ...
    both = native.paged_attention(to_pd(q), kc, vc, _meta(bt, [n, 40], [n, 40], bs), scale).numpy()
    np.testing.assert_array_equal(both[:n], whole)
    # ... and its last 83 queries as a second prefill chunk over the cached first 67 keys: the rows fall
    # into other 16-row tiles, and the keys are still taken in the same 64-key chunks.
    tail = native.paged_attention(to_pd(q[67:n]), kc, vc, _meta(bt[:1], [n - 67], [n], bs), scale).numpy()
    np.testing.assert_array_equal(tail, whole[67:])
