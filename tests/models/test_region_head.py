"""The LM head inside the decode region (kernels/fd_kernels/csrc/decode_region.cc): a greedy pure-decode step
on GGUF weights runs the head's GEMM and each row's argmax scan in the region's threads, after the final
norm. The oracle is exact: the same step with FD_DECODE_REGION_HEAD=0 (the head after the region, through
linear_argmax) gives the same hidden states bit for bit and the same tokens, and the tokens are numpy's
first argmax of compute_logits; the native counter proves which path each step took. Batch 1 and a
multi-row step, short contexts and a split-K one (over 256 keys). A NaN row gives no tokens, as
linear_argmax's -1 does. The module re-runs in a subprocess under each lower ISA level (FD_KERNELS_ISA).
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest
from isa_levels import ISA_LEVELS, rerun_at_isa
from ops_backend import switched_ops
from tiny_models import load_fd_model, make_attention_metadata, make_tiny_gguf

from fdcli_engine.runner.kv_cache import allocate_kv_caches

BLOCK_SIZE = 16
BLOCKS = {"a": [0], "b": [1], "c": list(range(2, 22))}
# (sequence, tokens already in the cache, new tokens) per step: a prefill of three prompts (c: 300 keys,
# two attention parts), then pure-decode steps of 1 and 3 rows, then 1 row on the long context.
STEPS = [
    [("a", 0, 6), ("b", 0, 3), ("c", 0, 300)],
    [("a", 6, 1)],
    [("a", 7, 1), ("b", 3, 1), ("c", 300, 1)],
    [("c", 301, 1)],
]
DECODE_STEPS = 3


@pytest.fixture(autouse=True)
def native_ops():
    yield from switched_ops("native")


def gguf_model(tiny_checkpoint, tmp_path, qtype: str, tied: bool):
    folder = tiny_checkpoint(
        "LlamaForCausalLM", seed=4, max_position_embeddings=1024, tie_word_embeddings=tied
    )
    return load_fd_model(make_tiny_gguf(folder, tmp_path / f"tiny-{qtype}.gguf", qtype), quantization="gguf")


def run(model, head_in_region: bool, monkeypatch):
    """Each step's (hidden, tokens) from forward_greedy on fresh caches, ids fixed per step."""
    monkeypatch.setenv("FD_DECODE_REGION_HEAD", "1" if head_in_region else "0")
    caches = allocate_kv_caches(model, 24, BLOCK_SIZE, "bfloat16")
    rng = np.random.default_rng(7)
    results = []
    for step in STEPS:
        entries = [(done, new, BLOCKS[s]) for s, done, new in step]
        meta, positions = make_attention_metadata(entries, BLOCK_SIZE)
        ids = rng.integers(0, model.vocab_size, size=sum(n for _, _, n in step), dtype=np.int64)
        hidden, tokens = model.forward_greedy(paddle.to_tensor(ids), positions, caches, meta)
        results.append((hidden.numpy(), tokens))
    return results


@pytest.mark.parametrize(("qtype", "tied"), [("Q8_0", True), ("Q4_1", False)])
def test_head_in_region_matches_linear_argmax(qtype, tied, tiny_checkpoint, tmp_path, monkeypatch):
    from fd_kernels import native

    model = gguf_model(tiny_checkpoint, tmp_path, qtype, tied)
    assert model.decoder_stack.has_head and model.decoder_stack.embeds_tokens
    steps, heads = native.decode_region_steps(), native.decode_region_head_steps()
    want = run(model, False, monkeypatch)
    assert native.decode_region_steps() - steps == DECODE_STEPS
    assert native.decode_region_head_steps() == heads
    got = run(model, True, monkeypatch)
    assert native.decode_region_head_steps() - heads == DECODE_STEPS
    for (wh, wt), (gh, gt) in zip(want, got, strict=True):
        assert np.isfinite(wh).all() and np.array_equal(wh, gh)
        logits = model.compute_logits(paddle.to_tensor(wh)).numpy()
        assert gt == wt == np.argmax(logits, axis=1).tolist()


def test_a_nan_logit_in_the_region_gives_no_tokens(tiny_checkpoint, tmp_path, monkeypatch):
    """A NaN scale in the head's first Q8_0 record (column 0, block 0) makes column 0's logit NaN in
    every row: the region's scan gives -1 as linear_argmax does, so no tokens."""
    from fd_kernels import native

    model = gguf_model(tiny_checkpoint, tmp_path, "Q8_0", True)
    caches = allocate_kv_caches(model, 24, BLOCK_SIZE, "bfloat16")
    meta, positions = make_attention_metadata([(0, 5, BLOCKS["a"])], BLOCK_SIZE)
    _, tokens = model.forward_greedy(paddle.to_tensor(np.arange(5, dtype=np.int64)), positions, caches, meta)
    assert tokens is not None
    packed = np.from_dlpack(model.lm_head.lw.packed).reshape(-1).view(np.uint8)
    packed[:2] = np.frombuffer(np.float16(np.nan).tobytes(), dtype=np.uint8)  # the plan points into it
    heads = native.decode_region_head_steps()
    meta, positions = make_attention_metadata([(5, 1, BLOCKS["a"])], BLOCK_SIZE)
    hidden, tokens = model.forward_greedy(
        paddle.to_tensor(np.array([9], dtype=np.int64)), positions, caches, meta
    )
    assert native.decode_region_head_steps() - heads == 1
    assert np.isfinite(hidden.numpy()).all()
    assert tokens is None and model.compute_greedy_tokens(hidden) is None


@pytest.mark.parametrize("isa", ISA_LEVELS)
def test_head_in_region_on_lower_isa_levels(isa):
    """This module again with FD_KERNELS_ISA forced lower (the default run covers the best level)."""
    rerun_at_isa(isa, [__file__, "-k", "not lower_isa"])
