"""Prompt rows of quantized linears on the bf16 levels (csrc/amx.cc: AMX tiles, or AVX512-BF16 dot products
where the CPU has no AMX): computed as bf16(x) @ bf16(W) with fp32
accumulation, where W is the exact dequantized operand. The oracle rounds both operands to bf16 in numpy
and multiplies in float64, so the only allowed difference is fp32 summation (the 1e-5 bound of
test_linear.py). Rows not marked as prompt rows stay on their kind's other path (fp32 for wint8 / wint4,
the fixed-point kernel of test_qgemm.py for GGUF blocks), and a row's result does not depend on the
other rows of its batch (the tiles for many prompt rows, the AVX-512 microkernel for few; GGUF blocks
always take the tiles)."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import to_pd, to_rows


@pytest.fixture(autouse=True)
def bf16_levels_only(native):
    if native.active_isa() not in native.BF16_PROMPT_ISAS:
        pytest.skip("the CPU (or FD_KERNELS_ISA) selects no bf16 prompt-row level (AMX or AVX512-BF16)")


def bf16(a: np.ndarray) -> np.ndarray:
    """Round float32 to bf16 (nearest even), kept as float32."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def _check(y, expect, x, w):
    bound = np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64).T
    np.testing.assert_array_less(np.abs(y - expect), 1e-5 * bound + 1e-6)


def _weight(native, rng, kind, k, n):
    w = rng.standard_normal((n, k), dtype=np.float32)
    b = rng.standard_normal(n, dtype=np.float32)
    if kind in ("Q4_0", "Q4_1", "Q8_0"):
        from gguf import GGMLQuantizationType
        from gguf.quants import quantize

        qtype = GGMLQuantizationType[kind]
        raw = np.ascontiguousarray(quantize(w, qtype)).view(np.uint8).reshape(n, -1)
        return native.prepare_linear_gguf(raw, int(qtype), k, b), b
    return native.prepare_linear(w, b, kind), b


@pytest.mark.parametrize("kind", ["wint8", "wint4", "Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize(
    "m,k,n", [(1, 64, 32), (5, 96, 70), (8, 576, 200), (33, 128, 45), (100, 640, 96), (70, 4096, 300)]
)
def test_prompt_rows_are_bf16_times_bf16_in_fp32(native, rng, kind, m, k, n):
    lw, b = _weight(native, rng, kind, k, n)
    w = lw.dequantize()
    x = rng.standard_normal((m, k), dtype=np.float32)
    y = native.linear(to_pd(x), lw, to_rows(np.ones(m, dtype=bool))).numpy()
    xb, wb = bf16(x), bf16(w)
    _check(y, xb.astype(np.float64) @ wb.astype(np.float64).T + b, xb, wb)
    # ... which is not the other path's result: the rounding is really there (else this test proves
    # nothing). That path is fp32 for wint8 / wint4; GGUF blocks' is checked in test_qgemm.py.
    y32 = native.linear(to_pd(x), lw).numpy()
    if kind.startswith("wint"):
        _check(y32, x.astype(np.float64) @ w.astype(np.float64).T + b, x, w)
    assert np.abs(y - y32).max() > 1e-4 * np.abs(y32).max()


def _mask(rng, m: int, layout: str) -> np.ndarray:
    if layout == "scattered":  # rows of both kinds interleaved: gathered, computed, scattered back
        mask = rng.random(m) < 0.6
        mask[0], mask[-1] = True, False
        return mask
    # A serving step: the running requests' generated-token rows, then new prompts (or the reverse):
    # each kind is one run of rows, computed in place.
    mask = np.arange(m) >= m // 3
    return mask if layout == "generated-first" else ~mask


@pytest.mark.parametrize("kind", ["wint4", "Q4_1"])
@pytest.mark.parametrize("m", [2, 40, 97])
@pytest.mark.parametrize("layout", ["scattered", "generated-first", "prompts-first"])
def test_mixed_batch_keeps_each_row_on_its_own_path(native, rng, kind, m, layout):
    k, n = 192, 130
    lw, _ = _weight(native, rng, kind, k, n)
    x = rng.standard_normal((m, k), dtype=np.float32)
    mask = _mask(rng, m, layout)
    y = native.linear(to_pd(x), lw, to_rows(mask)).numpy()
    all_bf16 = native.linear(to_pd(x), lw, to_rows(np.ones(m, dtype=bool))).numpy()
    all_fp32 = native.linear(to_pd(x), lw).numpy()
    w = lw.dequantize()
    _check(y[mask], all_bf16[mask], bf16(x[mask]), bf16(w))
    _check(y[~mask], all_fp32[~mask], x[~mask], w)


@pytest.mark.parametrize("kind", ["wint4", "Q8_0"])
def test_a_prompt_row_does_not_depend_on_its_batch(native, rng, kind):
    # wint4: 3 prompt rows alone take the AVX-512 microkernel on rounded operands, inside 64 the tiles.
    # GGUF blocks take the tiles either way.
    k, n = 576, 96
    lw, _ = _weight(native, rng, kind, k, n)
    x = rng.standard_normal((64, k), dtype=np.float32)
    alone = native.linear(to_pd(x[:3]), lw, to_rows(np.ones(3, dtype=bool))).numpy()
    batched = native.linear(to_pd(x), lw, to_rows(np.ones(64, dtype=bool))).numpy()[:3]
    _check(alone, batched, bf16(x[:3]), bf16(lw.dequantize()))


@pytest.mark.parametrize("m", [5, 40, 300])
def test_a_tile_row_is_bit_identical_in_any_batch(native, rng, m):
    # GGUF blocks take the tiles at any row count. The threads share a call's (panel chunk, row block)
    # items however many rows it has (few rows cut the chunks smaller; 1,000 columns at K = 576 are two
    # chunks), and none of that may change a row's bits.
    k, n = 576, 1000
    lw, _ = _weight(native, rng, "Q4_1", k, n)
    x = rng.standard_normal((m, k), dtype=np.float32)
    batched = native.linear(to_pd(x), lw, to_rows(np.ones(m, dtype=bool))).numpy()
    for r in (0, m - 1):
        alone = native.linear(to_pd(x[r : r + 1]), lw, to_rows(np.ones(1, dtype=bool))).numpy()
        np.testing.assert_array_equal(alone[0], batched[r])


def test_rows_mask_is_ignored_for_fp32_weights_and_other_row_counts(native, rng):
    w = rng.standard_normal((40, 64), dtype=np.float32)
    x = rng.standard_normal((6, 64), dtype=np.float32)
    lw = native.prepare_linear(w, None, None)
    rows = to_rows(np.ones(6, dtype=bool))
    _check(native.linear(to_pd(x), lw, rows).numpy(), x.astype(np.float64) @ w.astype(np.float64).T, x, w)
    q = native.prepare_linear(w, None, "wint8")
    wq = q.dequantize()
    fewer = to_rows(np.ones(5, dtype=bool))  # an LM head over fewer rows than the step
    _check(native.linear(to_pd(x), q, fewer).numpy(), x.astype(np.float64) @ wq.astype(np.float64).T, x, wq)


@pytest.mark.parametrize("kind", ["wint8", "wint4", "Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize(
    "m,k,n",
    [
        (40, 96, 70),
        (130, 576, 200),
        (64, 1536, 96),
        (300, 576, 1000),
        (1000, 576, 200),
        (600, 1536, 96),
        (600, 1536, 576),
    ],
)
def test_prepacked_tiles_give_the_per_call_dequantized_bits(native, rng, kind, m, k, n):
    # The tiles a linear keeps (made once, on its first prompt rows) hold exactly what the kernel
    # dequantizes per call without them, so both give the same bits, and only the quantized weights
    # pay the memory. The prepacked call splits its work by panel regions where A's tiles are small (up
    # to ~900 rows at K = 576, ~340 at 1536, and fewer bytes than the weight's) or where K is cut into
    # slabs and the weight into several chunks (600 x 1536 x 576 with 2 threads), and by rows otherwise;
    # the per-call path splits it its own way: the same bits regardless.
    lw, _ = _weight(native, rng, kind, k, n)
    x, rows = to_pd(rng.standard_normal((m, k), dtype=np.float32)), to_rows(np.ones(m, dtype=bool))
    kept = native.linear(x, lw, rows).numpy()
    tiles = lw.tiles
    assert tiles is not None and tiles.shape[0] == (n + 31) // 32 * 32 * ((k + 31) // 32 * 32)
    lw.tiles = native._empty("int16")  # no tiles: dequantized in the call
    np.testing.assert_array_equal(native.linear(x, lw, rows).numpy(), kept)
    assert native.prepare_linear(rng.standard_normal((n, k), dtype=np.float32)).amx_tiles().shape[0] == 0


def test_tiles_of_another_weight_are_refused(native, rng):
    a, _ = _weight(native, rng, "wint8", 64, 32)
    b, _ = _weight(native, rng, "wint8", 64, 64)
    a.tiles = b.amx_tiles()
    with pytest.raises(ValueError, match="tiles do not match the weight"):
        native.linear(
            to_pd(rng.standard_normal((16, 64), dtype=np.float32)), a, to_rows(np.ones(16, dtype=bool))
        )


@pytest.mark.parametrize("m", [5, 300])
def test_activations_round_to_nearest_even_into_the_tiles(native, rng, m):
    # A diagonal weight makes each output one product of two bf16 values, exact in fp32, so the output
    # shows how every activation was rounded: ties (low half 0x8000) to even, either side of them, and
    # values that round up into the next binade, against the integer formula of bf16(). Whole 32-value
    # k-steps and a partial one (k = 80) both convert.
    k = n = 80
    w = np.diag(rng.uniform(0.5, 2.0, n).astype(np.float32))
    lw = native.prepare_linear(w, None, "wint8")
    wd = bf16(np.diag(lw.dequantize()))
    x = rng.standard_normal((m, k), dtype=np.float32).view(np.uint32)
    low = rng.choice(np.array([0x8000, 0x7FFF, 0x8001, 0xFFFF, 0x0000], dtype=np.uint32), size=x.shape)
    x = ((x & np.uint32(0xFFFF0000)) | low).view(np.float32)
    x[:, 7] = np.float32(np.uint32(0x3F7FFFFF).view(np.float32))  # rounds up to 1.0
    y = native.linear(to_pd(x), lw, to_rows(np.ones(m, dtype=bool))).numpy()
    np.testing.assert_array_equal(y, bf16(x) * wd)
    truncated = (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    assert not np.array_equal(y, truncated * wd)  # the rounding is really tested


def test_an_output_past_32_mb_streams_the_same_bits(native, rng):
    # 200 x 49,152 fp32 outputs (39 MB, an LM head over a prompt) are written with non-temporal stores
    # where a 32 x 32 block is whole; the last 8 rows are a partial block, written as usual. Every row
    # must hold the bits it has alone (196 KB of output, ordinary stores) and the bf16 products.
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    k, n, m = 64, 49152, 200
    w = rng.standard_normal((n, k), dtype=np.float32)
    raw = np.ascontiguousarray(quantize(w, GGMLQuantizationType.Q8_0)).view(np.uint8).reshape(n, -1)
    lw = native.prepare_linear_gguf(raw, int(GGMLQuantizationType.Q8_0), k)  # no bias, as an LM head
    x = rng.standard_normal((m, k), dtype=np.float32)
    y = native.linear(to_pd(x), lw, to_rows(np.ones(m, dtype=bool))).numpy()
    for r in (0, 31, 100, 191, 192, m - 1):
        alone = native.linear(to_pd(x[r : r + 1]), lw, to_rows(np.ones(1, dtype=bool))).numpy()
        np.testing.assert_array_equal(alone[0], y[r])
    xb, wb = bf16(x[::37]), bf16(lw.dequantize())
    _check(y[::37], xb.astype(np.float64) @ wb.astype(np.float64).T, xb, wb)
