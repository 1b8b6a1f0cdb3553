"""paged_attention vs the reference (dense attention over gathered blocks): varlen batches mixing prefill,
chunked prefill over a cached prefix and decode; GQA ratios 1, 3, 4; block sizes that the contexts cross;
fp32 and bf16 caches. Tolerance 2e-5 absolute on outputs of unit-scale values (online vs two-pass softmax
in fp32).

A bf16 cache is read by widening each value exactly, so the kernel on it must also equal the fp32 kernel on
the widened values (the same arithmetic, in the same order, on the same numbers): 1e-6 absolute, which only
leaves room for a compiler contracting a scalar tail into an FMA in one instantiation and not the other."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import to_pd

from fdcli_engine.step_types import AttentionMetadata


def make_batch(rng, q_lens, ctx_lens, nh, nkv, hd, bs, meta_dtype):
    max_blocks = max(-(-c // bs) for c in ctx_lens) + 1  # one spare, unused entry per row
    nb = len(ctx_lens) * max_blocks + 3
    # Blocks scattered over the pool, so the kernel must follow the table.
    bt = rng.permutation(nb)[: len(ctx_lens) * max_blocks].reshape(len(ctx_lens), max_blocks)
    qsl = np.concatenate([[0], np.cumsum(q_lens)])
    lens = np.asarray(ctx_lens)
    meta = AttentionMetadata(
        slot_mapping=to_pd(np.zeros(int(qsl[-1]), np.int64)),
        query_start_loc=to_pd(qsl.astype(meta_dtype)),
        seq_lens=to_pd(lens.astype(meta_dtype)),
        block_tables=to_pd(bt.astype(meta_dtype)),
        max_query_len=int(max(q_lens)),
        max_seq_len=int(max(ctx_lens)),
        block_size=bs,
        query_start_loc_np=qsl.astype(np.int32),
        seq_lens_np=lens.astype(np.int32),
    )
    kc = to_pd(rng.standard_normal((nb, nkv, bs, hd), dtype=np.float32))
    vc = to_pd(rng.standard_normal((nb, nkv, bs, hd), dtype=np.float32))
    q = to_pd(rng.standard_normal((int(qsl[-1]), nh, hd), dtype=np.float32))
    return q, kc, vc, meta


def bf16_caches(kc, vc):
    """The caches in bf16 (Paddle's cast: what reshape_and_cache writes, test_kv_cache_bf16.py)."""
    return kc.astype("bfloat16"), vc.astype("bfloat16")


def widened(cache) -> np.ndarray:
    """A bf16 cache's values as fp32, widened in numpy (bits << 16), independently of Paddle's cast."""
    return (cache.view("uint16").numpy().astype(np.uint32) << 16).view(np.float32)


def check_bf16_against_fp32_kernel(native, q, kb, vb, meta, scale, got, atol=1e-6):
    """The tight oracle: the fp32-cache kernel on the widened bf16 values."""
    want = native.paged_attention(q, to_pd(widened(kb)), to_pd(widened(vb)), meta, scale).numpy()
    np.testing.assert_allclose(got, want, atol=atol, rtol=0)


CASES = [
    # (q_lens, ctx_lens): prefill only, decode only, and a mix with a chunked prefill over a cached prefix.
    ([37], [37]),
    ([1, 1, 1], [1, 17, 70]),
    ([5, 1, 20, 1], [5, 33, 52, 16]),
    ([0, 3, 1], [9, 3, 40]),  # a sequence with no query tokens this step
]


@pytest.mark.parametrize("kv", ["float32", "bfloat16"])
@pytest.mark.parametrize("q_lens,ctx_lens", CASES)
@pytest.mark.parametrize("nh,nkv", [(4, 4), (9, 3), (8, 2)])
@pytest.mark.parametrize("bs,hd", [(16, 64), (5, 24), (16, 128)])
def test_matches_reference(native, ref, rng, q_lens, ctx_lens, nh, nkv, bs, hd, kv):
    q, kc, vc, meta = make_batch(rng, q_lens, ctx_lens, nh, nkv, hd, bs, np.int32)
    if kv == "bfloat16":
        kc, vc = bf16_caches(kc, vc)
    scale = hd**-0.5
    got = native.paged_attention(q, kc, vc, meta, scale).numpy()
    want = ref.paged_attention(q, kc, vc, meta, scale).numpy()
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)
    if kv == "bfloat16":
        check_bf16_against_fp32_kernel(native, q, kc, vc, meta, scale, got)


@pytest.mark.parametrize("kv", ["float32", "bfloat16"])
def test_long_context_int64_metadata(native, ref, rng, kv):
    # 600 keys cross 38 blocks and many online-softmax chunks; large logits stress the max tracking.
    q, kc, vc, meta = make_batch(rng, [3, 1], [600, 301], 6, 2, 32, 16, np.int64)
    if kv == "bfloat16":
        kc, vc = bf16_caches(kc, vc)
    got = native.paged_attention(q * 4, kc, vc, meta, 0.5).numpy()
    want = ref.paged_attention(q * 4, kc, vc, meta, 0.5).numpy()
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)
    if kv == "bfloat16":
        check_bf16_against_fp32_kernel(native, q * 4, kc, vc, meta, 0.5, got)


def test_bad_metadata_is_rejected(native, rng):
    q, kc, vc, meta = make_batch(rng, [4], [4], 2, 2, 8, 4, np.int32)
    meta.seq_lens = to_pd(np.array([3], np.int32))  # fewer keys than queries
    with pytest.raises(ValueError, match="more queries than context"):
        native.paged_attention(q, kc, vc, meta, 1.0)
