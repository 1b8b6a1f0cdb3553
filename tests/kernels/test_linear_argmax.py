"""The LM head with greedy argmax in one op (csrc/lm_head_argmax.cc): each row's token must be numpy's
argmax (first index among equal maxima) of the logits `linear` produces for the same input, for every
weight format a linear can hold, row counts around the GEMM's row blocks, vocabularies split over one or
several threads (many rows' logits are scanned in the threads' column shares, a few rows' by one
thread), ties inside a lane, across lanes and across the threads' shares, and NaN logits (None, as the
greedy fast path leaves such rows to the sampling op). The reference op is held to the same rule
against the reference linear. test_isa.py re-runs this file on every lower ISA path."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import to_pd

GGUF = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8}
FORMATS = ["f32", "wint8", "wint4", *GGUF]
# (k, vocab): one block / panel up to a SmolLM2-sized head; 12000 and 49152 split over two threads.
SHAPES = [(32, 17), (64, 300), (96, 4100), (64, 12000), (576, 49152)]
ROWS = [1, 2, 3, 5, 8, 70]  # from 6 rows of 49152 logits the threads scan their shares


def _weights(rng, fmt: str, n: int, k: int, copies=()):
    """A packed [n, k] weight; `copies` (src, dst) make row dst identical to row src (so its logits are
    equal bits: the same data through the same arithmetic)."""
    from fd_kernels import native

    w = rng.standard_normal((n, k), dtype=np.float32)
    b = rng.standard_normal(n, dtype=np.float32) * 0.1
    if fmt in GGUF:
        from gguf import GGMLQuantizationType
        from gguf.quants import quantize

        raw = np.ascontiguousarray(quantize(w, GGMLQuantizationType[fmt])).view(np.uint8).reshape(n, -1)
        for src, dst in copies:
            raw[dst], b[dst] = raw[src], b[src]
        return native.prepare_linear_gguf(raw, GGUF[fmt], k, b)
    for src, dst in copies:
        w[dst], b[dst] = w[src], b[src]
    return native.prepare_linear(w, b, None if fmt == "f32" else fmt)


def _expected(logits: np.ndarray) -> list[int] | None:
    if np.isnan(logits).any(axis=1).any():
        return None
    return logits.argmax(axis=1).tolist()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("k,n", SHAPES)
def test_matches_argmax_of_linear(native, rng, fmt, k, n):
    lw = _weights(rng, fmt, n, k)
    for m in ROWS:
        x = to_pd(rng.standard_normal((m, k), dtype=np.float32))
        logits = native.linear(x, lw).numpy()
        assert native.linear_argmax(x, lw) == _expected(logits)


# 30 rows of 12000 logits: the threads scan their column shares (3 rows: one thread scans).
@pytest.mark.parametrize("fmt", ["f32", "Q8_0"])
def test_logits_past_the_kept_scratch(native, rng, fmt):
    """90 x 49152 logits (over 2^22 floats) go to a buffer freed after the call; then a small call again."""
    k, n = 64, 49152
    lw = _weights(rng, fmt, n, k)
    for m in (90, 2, 91):
        x = to_pd(rng.standard_normal((m, k), dtype=np.float32))
        assert native.linear_argmax(x, lw) == _expected(native.linear(x, lw).numpy())


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n,m", [(300, 3), (12000, 3), (12000, 30)])
def test_ties_go_to_the_lowest_index(native, rng, fmt, n, m):
    k = 64
    x = to_pd(rng.standard_normal((m, k), dtype=np.float32))
    top = int(native.linear(x, _weights(np.random.default_rng(7), fmt, n, k)).numpy()[0].argmax())
    # Row 0's winner copied to an earlier column (another lane, another share when n splits), to the next
    # column (same lane group) and to the last column: the earliest copy must win.
    for dst in {0, max(0, top - 17), n // 2 - 1, min(n - 1, top + 1), n - 1} - {top}:
        lw = _weights(np.random.default_rng(7), fmt, n, k, copies=[(top, dst)])
        logits = native.linear(x, lw).numpy()
        assert logits[0, dst] == logits[0, top] == logits[0].max()  # a real tie
        assert native.linear_argmax(x, lw)[0] == min(top, dst)
        assert native.linear_argmax(x, lw) == _expected(logits)


@pytest.mark.parametrize("n,m", [(300, 3), (12000, 3), (12000, 30)])
def test_a_nan_row_gives_none(native, rng, n, m):
    k = 64
    lw = _weights(rng, "f32", n, k)
    x = rng.standard_normal((m, k), dtype=np.float32)
    assert native.linear_argmax(to_pd(x), lw) is not None
    x[1, 5] = np.nan  # row 1's logits are all NaN, the others finite
    logits = native.linear(to_pd(x), lw).numpy()
    assert np.isnan(logits[1]).all() and not np.isnan(np.delete(logits, 1, axis=0)).any()
    assert native.linear_argmax(to_pd(x), lw) is None
    # A single NaN logit in a share's tail (after the vector loop) and one in its body.
    for col in (n - 1, n // 2 - 3, 40):
        b = np.zeros(n, dtype=np.float32)
        b[col] = np.nan
        w = rng.standard_normal((n, k), dtype=np.float32)
        lw = native.prepare_linear(w, b, None)
        assert native.linear_argmax(to_pd(x[[0]]), lw) is None
        assert native.linear_argmax(to_pd(np.delete(x, 1, axis=0)), lw) is None


def test_all_equal_and_infinite_logits(native):
    k, n = 32, 9000
    lw = native.prepare_linear(np.zeros((n, k), dtype=np.float32), None, None)
    for m in (2, 40):  # one thread's scan; the threads' shares (columns 0-4499, 4500-8999)
        x = to_pd(np.ones((m, k), dtype=np.float32))
        assert native.linear_argmax(x, lw) == [0] * m
    b = np.full(n, -np.inf, dtype=np.float32)
    b[[4600, 8000]] = np.inf
    lw = native.prepare_linear(np.zeros((n, k), dtype=np.float32), b, None)
    assert native.linear_argmax(x, lw) == [4600] * 40


def test_bad_input_is_a_value_error(native, rng):
    lw = _weights(rng, "f32", 40, 32)
    with pytest.raises(ValueError):
        native.linear_argmax(to_pd(np.ones((2, 64), dtype=np.float32)), lw)
    with pytest.raises(ValueError):
        native.linear_argmax(to_pd(np.ones((2, 2, 32), dtype=np.float32)), lw)


@pytest.mark.parametrize("fmt", ["f32", "wint8", "Q8_0"])
def test_reference_op_follows_the_same_rule(ref, rng, fmt):
    k, n = 64, 500
    w = rng.standard_normal((n, k), dtype=np.float32)
    w[7] = w[300]  # a tie, the earlier index wins
    if fmt == "Q8_0":
        from gguf import GGMLQuantizationType
        from gguf.quants import quantize

        raw = np.ascontiguousarray(quantize(w, GGMLQuantizationType.Q8_0)).view(np.uint8).reshape(n, -1)
        lw = ref.prepare_linear_gguf(raw, GGUF[fmt], k, None)
    else:
        lw = ref.prepare_linear(w, None, None if fmt == "f32" else fmt)
    x = rng.standard_normal((4, k), dtype=np.float32)
    x[2] = w[300]  # row 2 scores rows 7 and 300 highest
    logits = ref.linear(to_pd(x), lw).numpy()
    tokens = ref.linear_argmax(to_pd(x), lw)
    assert tokens == _expected(logits) and tokens[2] == 7
    x[3, 0] = np.nan
    assert ref.linear_argmax(to_pd(x), lw) is None
