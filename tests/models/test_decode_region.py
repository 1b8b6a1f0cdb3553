"""The decoder stack's pure-decode path in one parallel region (kernels/fd_kernels/csrc/decode_region.cc)
against the per-op native loop of DecoderForCausalLM.forward.

The region runs the per-op path's kernels on the per-op path's work items, so the oracle is exact: hidden
states and KV caches bit-identical (np.array_equal) on GGUF block weights (the region's scope), at 1 to 33
decode rows, contexts short (one attention item per KV head) and long (split-K parts and their combine),
every KV cache dtype and the Qwen3 q/k norms; the native counter proves the region really ran those steps.
The whole module re-runs in a subprocess under each lower ISA level the CPU has (FD_KERNELS_ISA).
"""

from __future__ import annotations

import pytest
from isa_levels import ISA_LEVELS, rerun_at_isa

# reference_ops: test_decoder_stack's override of the directory's fixture (native ops), used here too.
from test_decoder_stack import assert_bit_identical, reference_ops  # noqa: F401
from tiny_models import load_fd_model, make_tiny_gguf

# Steps of (seq id, prompt length, new tokens). Prefill steps (the per-op loop inside the stack) fill a
# context of 270 keys for a and 600 for l (over the attention's 256-key parts: two and three parts) and
# short ones for the others; then pure-decode steps of 1, 2, 3, 5, 8, 16 and 33 rows, one query per
# sequence, with and without (split-K) long contexts ("g" and "h": decode rows on empty contexts, prompt
# length 0).
MANY = [(f"m{i}", 1 + i % 7) for i in range(31)]
PREFILL = [
    [("a", 270, 270)],
    [("b", 9, 9), ("c", 20, 20), ("d", 5, 5), ("e", 3, 3), ("f", 2, 2)],
    [("l", 600, 600)],
    [(s, n, n) for s, n in MANY],
]
DECODE = [
    [("a", 270, 1)],
    [("c", 20, 1)],
    [("b", 9, 1), ("a", 270, 1)],
    [("d", 5, 1), ("a", 270, 1), ("e", 3, 1)],
    [("b", 9, 1), ("c", 20, 1), ("d", 5, 1), ("e", 3, 1), ("f", 2, 1)],
    [
        ("a", 270, 1),
        ("b", 9, 1),
        ("c", 20, 1),
        ("d", 5, 1),
        ("e", 3, 1),
        ("f", 2, 1),
        ("g", 0, 1),
        ("h", 0, 1),
    ],
    [("a", 270, 1), ("b", 9, 1), ("c", 20, 1), ("d", 5, 1), ("e", 3, 1), ("f", 2, 1), ("i", 2, 2)],
    [("l", 600, 1), ("a", 270, 1)] + [(s, n, 1) for s, n in MANY[:14]],
    [(s, n, 1) for s, n in MANY[14:30]],
    [(s, n, 1) for s, n in MANY[:16]] + [("a", 270, 1)] + [(s, n, 1) for s, n in MANY[16:]] + [("l", 600, 1)],
]
# The 8-row step with "i" carries a 2-token prompt: not pure decode, so the per-op loop. Then 16 rows
# with two split-K contexts first, 16 short ones, and 33 rows with the split contexts among them.


def gguf_model(tiny_checkpoint, tmp_path, arch: str, qtype: str):
    folder = tiny_checkpoint(arch, max_position_embeddings=1024)
    return load_fd_model(make_tiny_gguf(folder, tmp_path / f"tiny-{qtype}.gguf", qtype), quantization="gguf")


def assert_region_is_bit_identical(model, kv_cache_dtype: str, monkeypatch, steps) -> None:
    from fd_kernels import native

    before = native.decode_region_steps()
    assert_bit_identical(model, kv_cache_dtype, monkeypatch, steps=steps)
    # The op loop never enters the region; the stack run enters it for its pure-decode steps only.
    assert native.decode_region_steps() - before == sum(
        all(new == 1 for _, _, new in step) and len(step) <= 64 for step in steps
    )


@pytest.mark.parametrize(
    ("qtype", "kv_cache_dtype"), [("Q4_1", "float32"), ("Q8_0", "bfloat16"), ("Q4_0", "int8")]
)
def test_region_matches_the_op_loop(qtype, kv_cache_dtype, tiny_checkpoint, tmp_path, monkeypatch):
    model = gguf_model(tiny_checkpoint, tmp_path, "LlamaForCausalLM", qtype)
    assert_region_is_bit_identical(model, kv_cache_dtype, monkeypatch, PREFILL + DECODE)


@pytest.mark.parametrize("arch", ["Qwen2ForCausalLM", "Qwen3ForCausalLM"])
def test_region_with_qkv_bias_and_qk_norm(arch, tiny_checkpoint, tmp_path, monkeypatch):
    model = gguf_model(tiny_checkpoint, tmp_path, arch, "Q8_0")
    assert_region_is_bit_identical(model, "bfloat16", monkeypatch, PREFILL + DECODE)


def test_region_with_omp_barriers(tiny_checkpoint, tmp_path, monkeypatch):
    """FD_DECODE_REGION_PREFETCH=0 (an A/B switch): omp barriers instead of the prefetching spin barrier."""
    monkeypatch.setenv("FD_DECODE_REGION_PREFETCH", "0")
    model = gguf_model(tiny_checkpoint, tmp_path, "LlamaForCausalLM", "Q8_0")
    assert_region_is_bit_identical(model, "bfloat16", monkeypatch, PREFILL + DECODE)


def test_region_steps_count_only_pure_decode(tiny_checkpoint, tmp_path, monkeypatch):
    """Prefill and mixed steps and non-GGUF weights keep the per-op loop (the counter stays put)."""
    from fd_kernels import native

    model = load_fd_model(
        tiny_checkpoint("LlamaForCausalLM", max_position_embeddings=1024), quantization="wint8"
    )
    before = native.decode_region_steps()
    assert_bit_identical(model, "float32", monkeypatch, steps=PREFILL[:2] + DECODE[:2])
    assert native.decode_region_steps() == before


@pytest.mark.parametrize("isa", ISA_LEVELS)
def test_region_on_lower_isa_levels(isa):
    """This module again with FD_KERNELS_ISA forced lower (the default run covers the best level)."""
    rerun_at_isa(isa, [__file__, "-k", "not lower_isa"])
