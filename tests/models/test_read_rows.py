"""The last layer computed for the read rows alone (runner/read_rows.py, meta.out): the kept rows' final
hidden states must be the bits the whole step gives them, on the fused C++ stack and on the per-op
loop, and every row's K/V must still reach the cache, for fp32 / wint8 / wint4 / GGUF Q8_0, Q4_0, Q4_1
weights and fp32 / bf16 / int8 caches. The steps read one row of a long prompt (on AMX CPUs the kept
prompt rows are padded up to the kS8 / kU4 tile threshold), mix decode and prompt rows, hold a prompt
chunk that samples nothing and a step that reads no row at all."""

from __future__ import annotations

import dataclasses

import numpy as np
import paddle
import pytest

# reference_ops: test_decoder_stack's override of the directory's fixture (native ops), used here too.
from test_decoder_stack import reference_ops, step_batch  # noqa: F401
from tiny_models import load_fd_model, make_attention_metadata, make_tiny_gguf

from fdcli_engine import ops
from fdcli_engine.runner import read_rows
from fdcli_engine.runner.input_batch import prompt_rows_tensor
from fdcli_engine.runner.kv_cache import allocate_kv_caches

BLOCK_SIZE = 4
# Steps of (seq id, prompt length, new tokens, sampled): a sampled sequence's last row is read.
STEPS = [
    [("a", 40, 40, True), ("b", 7, 3, False)],  # one read row of 40 prompt rows; b's chunk reads none
    [("a", 40, 1, True), ("b", 7, 4, True), ("c", 5, 5, True)],  # a decode row and two prompt ends
    [("d", 20, 12, False)],  # no row read: the last layer only writes K/V
    [("d", 20, 8, True), ("a", 40, 1, True)],
    [("a", 40, 1, True), ("b", 7, 1, True)],  # decode only: every row is read
]


def run_steps(model, use_stack: bool, kv_cache_dtype: str, reduce: bool):
    """Runs STEPS on fresh caches; returns (per step: hidden, kept rows or None), caches as numpy."""
    model.use_decoder_stack = use_stack
    caches = allocate_kv_caches(model, 64, BLOCK_SIZE, kv_cache_dtype)
    free = list(np.random.default_rng(0).permutation(64))
    seqs: dict[str, dict] = {}
    rng = np.random.default_rng(1)
    results = []
    for step in STEPS:
        entries, ids, mask = step_batch(step, seqs, free, rng)
        ends = np.cumsum([new for _, new, _ in entries])
        read = [int(end) - 1 for end, (*_, sampled) in zip(ends, step, strict=True) if sampled]
        meta, positions = make_attention_metadata(entries, BLOCK_SIZE)
        meta = dataclasses.replace(meta, prompt_rows=prompt_rows_tensor(np.asarray(mask), True))
        if reduce:
            meta = read_rows.out_metadata(meta, np.asarray(read, dtype=np.int64))
        out = model.forward(paddle.to_tensor(np.asarray(ids, dtype=np.int64)), positions, caches, meta)
        kept = meta.out.rows.numpy() if meta.out is not None else None
        if kept is not None:
            assert set(read) <= set(kept.tolist())
        results.append((out.numpy(), kept))
    return results, [[t.numpy() for t in layer] for layer in caches]


def assert_reduced_rows_match(model, kv_cache_dtype: str) -> None:
    assert model.decoder_stack is not None
    full, full_caches = run_steps(model, True, kv_cache_dtype, reduce=False)
    reduced_steps = 0
    for use_stack in (True, False):
        got, caches = run_steps(model, use_stack, kv_cache_dtype, reduce=True)
        for i, ((want, _), (out, kept)) in enumerate(zip(full, got, strict=True)):
            assert np.isfinite(want).all()
            if kept is None:
                assert np.array_equal(out, want), f"step {i}"
                continue
            reduced_steps += 1
            assert out.shape == (len(kept), want.shape[1]), f"step {i}: {out.shape}"
            assert np.array_equal(out, want[kept]), (
                f"step {i} (stack {use_stack}): {np.abs(out - want[kept]).max()}"
            )
        for i, (la, lb) in enumerate(zip(full_caches, caches, strict=True)):
            for a, b in zip(la, lb, strict=True):
                assert np.array_equal(a, b), f"layer {i} KV cache differs"
    # Every step but the pure decode ran on a subset, both paths; where prompt rows are padded to 8
    # (kS8 / kU4 tiles on AMX CPUs) the 4th step's 8 prompt rows and 1 decode row are all kept.
    assert reduced_steps == 2 * (3 if ops.prompt_tile_min_rows() >= 8 else 4)


@pytest.mark.parametrize("kv_cache_dtype", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize("quantization", [None, "wint8", "wint4"])
def test_read_rows_are_bit_identical(quantization, kv_cache_dtype, tiny_checkpoint):
    model = load_fd_model(tiny_checkpoint("Qwen3ForCausalLM"), quantization=quantization)
    assert_reduced_rows_match(model, kv_cache_dtype)


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen2ForCausalLM"])
def test_read_rows_other_architectures(arch, tiny_checkpoint):
    assert_reduced_rows_match(load_fd_model(tiny_checkpoint(arch), quantization="wint4"), "bfloat16")


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1"])
def test_read_rows_on_gguf_blocks(qtype, tiny_checkpoint, tmp_path):
    path = make_tiny_gguf(tiny_checkpoint("LlamaForCausalLM"), tmp_path / f"tiny-{qtype}.gguf", qtype)
    assert_reduced_rows_match(load_fd_model(path, quantization="gguf"), "bfloat16")


def test_kept_rows_are_suffixes_padded_to_the_tile_threshold():
    qsl = np.array([0, 3, 13, 20])
    prompt = np.array([0, 0, 0] + [1] * 10 + [1] * 5 + [0, 0], dtype=bool)  # decode rows, a prompt, a mix
    # Decode rows only: no padding.
    assert read_rows.kept_rows(qsl, prompt, np.array([0, 1, 2, 19]), 8).tolist() == [0, 1, 2, 19]
    # The 2nd sequence's last prompt row: 8 prompt rows kept, taken from the end backwards (the 3rd
    # sequence's prompt rows first, then the 2nd's), each sequence a suffix.
    kept = read_rows.kept_rows(qsl, prompt, np.array([12]), 8)
    assert kept.tolist() == list(range(10, 20))
    assert int(prompt[kept].sum()) == 8
    # Fewer prompt rows in the step than the threshold: all of them, no more.
    assert read_rows.kept_rows(qsl[:3], prompt[:13], np.array([12]), 16).tolist() == list(range(3, 13))
    # Nothing read: nothing kept.
    assert read_rows.kept_rows(qsl, prompt, np.array([], dtype=np.int64), 8).tolist() == []
    # No threshold (not the AMX level): only the read rows' suffixes.
    assert read_rows.kept_rows(qsl, prompt, np.array([12, 17]), 0).tolist() == [12, 17, 18, 19]
