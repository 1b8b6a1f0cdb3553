"""The fused sampler kernel (fd_sample_host) against its numpy reference (fd_kernels.reference.sampler).

Greedy rows must match exactly. A sampled row is the same draw on both sides (same uniforms), but the two
sum probabilities in different orders, so a token whose cumulative mass lies within float rounding of u
(or of the top-p cut) may differ: such a row must still be consistent with the reference's distribution
(the token is kept by the reference, or is as likely as its least likely kept token, and u falls in its
CDF interval up to 1e-4), and nearly all rows must match exactly. Small-vocabulary edge cases match
exactly. Distribution tests: many draws of one row, against the reference's filtered probabilities.
"""

from __future__ import annotations

import numpy as np
import pytest
from fd_kernels.reference import sampler as R

# temperature, top_k, top_p, min_p, repetition, presence, frequency
CONFIGS = [
    (1.0, 0, 1.0, 0.0, 1.0, 0.0, 0.0),  # plain temperature sampling
    (0.7, 50, 0.9, 0.0, 1.0, 0.0, 0.0),
    (1.3, 0, 0.8, 0.05, 1.0, 0.0, 0.0),
    (0.8, 0, 0.95, 0.0, 1.0, 0.0, 0.0),
    (0.0, 0, 1.0, 0.0, 1.3, 0.5, 0.7),  # greedy with every penalty
    (1.0, 1000, 1.0, 0.1, 1.0, 0.0, 0.0),
    (1.0, 1, 1.0, 0.0, 1.2, 0.0, 0.0),  # top_k = 1: greedy
    (0.5, 0, 0.7, 0.0, 0.8, -0.5, 0.2),  # penalties on a sampled row
    (1.0, 7, 1.0, 1.0, 1.0, 0.0, 0.0),  # min_p = 1: only the maximum
    (1e-3, 0, 1.0, 0.0, 1.0, 0.0, 0.0),  # tiny temperature, still sampled
]


def make_batch(rng, b, v, configs=CONFIGS, scale=3.0):
    logits = (rng.standard_normal((b, v)) * scale).astype(np.float32)
    params = np.array([configs[i % len(configs)] for i in range(b)], dtype=np.float64)
    chunks, meta, off = [], np.zeros((b, 4), dtype=np.int64), 0
    for i in range(b):
        prompt = rng.integers(0, v, 20)
        output = rng.choice(rng.integers(0, v, 4), 10)  # repeated tokens: counts > 1
        banned = np.append(rng.integers(0, v, 3), [v + 5, -1])  # out-of-vocab ids are ignored
        meta[i] = (off, prompt.size, output.size, banned.size)
        off += prompt.size + output.size + banned.size
        chunks += [prompt, output, banned]
    return logits, params, np.concatenate(chunks).astype(np.int64), meta


def penalized(logits, params, ids, meta, b):
    """Row b after penalties and bans, as the reference computes it."""
    off, n_p, n_o, n_b = meta[b]
    row = logits[b].copy()
    R.apply_penalties(row, *params[b, 4:7], ids[off : off + n_p], ids[off + n_p : off + n_p + n_o])
    ban = ids[off + n_p + n_o : off + n_p + n_o + n_b]
    row[ban[(ban >= 0) & (ban < row.size)]] = -np.inf
    return row


def ref_probs(row, prm, top_p=None, min_p=None):
    """The reference's filtered distribution of a penalized row (float64)."""
    temperature, top_k, p, mp = prm[:4]
    p = p if top_p is None else top_p
    mp = mp if min_p is None else min_p
    return R.filter_probs(row, float(temperature), int(top_k), float(p), float(mp)).astype(np.float64)


def consistent(row, prm, tok, u, tol=1e-4) -> bool:
    p = ref_probs(row, prm)
    if p[tok] == 0.0:  # outside the reference's set: only a boundary token may be
        q = ref_probs(row, prm, top_p=1.0, min_p=0.0)
        return q[tok] > 0 and q[tok] >= (1 - 1e-3) * q[p > 0].min()
    cdf = np.cumsum(p) / p.sum()
    return cdf[tok] - p[tok] / p.sum() - tol <= u <= cdf[tok] + tol


def check_batch(native, logits, params, ids, meta, uniforms, rejection=False, min_exact=0.9):
    got = native.sample(logits, params, ids, meta, uniforms, rejection)
    want = R.sample(logits, params, ids, meta, uniforms, rejection)
    greedy = (params[:, 0] < 1e-5) | (params[:, 1] == 1)
    np.testing.assert_array_equal(got[greedy], want[greedy])
    sampled = np.flatnonzero(~greedy)
    for b in sampled[got[sampled] != want[sampled]]:
        row = penalized(logits, params, ids, meta, b)
        # With rejection the accepted draw may have used any uniform; the fallback uses the last one.
        us = uniforms[b] if rejection else uniforms[b, -1:]
        assert any(consistent(row, params[b], got[b], u) for u in us), (
            f"row {b}: kernel {got[b]}, reference {want[b]}, params {params[b]}"
        )
    if sampled.size >= 10:
        assert np.mean(got[sampled] == want[sampled]) >= min_exact  # all of them, in practice
    return got


@pytest.mark.parametrize("b,v", [(1, 49152), (7, 1001), (16, 49152), (64, 4099), (64, 49152), (3, 151936)])
def test_sweep_matches_reference(native, rng, b, v):
    logits, params, ids, meta = make_batch(rng, b, v)
    check_batch(native, logits, params, ids, meta, rng.random((b, 1)))


@pytest.mark.parametrize("b,v", [(5, 1001), (32, 49152)])
def test_rejection_sweep_matches_reference(native, rng, b, v):
    logits, params, ids, meta = make_batch(rng, b, v)
    check_batch(native, logits, params, ids, meta, rng.random((b, 5)), rejection=True)


def test_inputs_are_not_modified(native, rng):
    logits, params, ids, meta = make_batch(rng, 8, 777)
    before = logits.copy()
    native.sample(logits, params, ids, meta, rng.random((8, 1)))
    np.testing.assert_array_equal(logits, before)


def _row(values, **kw):
    cfg = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, rep=1.0, presence=0.0, frequency=0.0)
    cfg.update(kw)
    logits = np.asarray([values], dtype=np.float32)
    params = np.array([list(cfg.values())], dtype=np.float64)
    return logits, params, np.zeros(1, dtype=np.int64), np.zeros((1, 4), dtype=np.int64)


EDGE_ROWS = [
    ("top_p=1", [2.0, 1.0, 0.0, -1.0, 0.5], {}),
    ("top_p tiny", [2.0, 1.0, 3.0, -1.0, 0.5], {"top_p": 1e-9}),
    ("top_p at an exact sum", np.log([0.5, 0.25, 0.15, 0.1]), {"top_p": 0.75}),
    ("ties at top_p", [2.0, 2.0, 2.0, 1.0, 1.0, 0.0], {"top_p": 0.5}),
    ("ties at the k-th value", [3.0, 1.0, 2.0, 2.0, 2.0, 0.0, 2.0], {"top_k": 2}),
    ("top_k >= vocab", [1.0, 0.0, -1.0], {"top_k": 5}),
    ("min_p=0", [1.0, 0.0, -1.0, -9.0], {"min_p": 0.0}),
    ("min_p=1 with tied maxima", [1.0, 3.0, -1.0, 3.0], {"min_p": 1.0}),
    ("min_p boundary", np.log([0.5, 0.25, 0.15, 0.1]), {"min_p": 0.29}),
    ("tiny temperature", [1.0, 1.001, 0.5, 1.0005], {"temperature": 1e-3}),
    ("greedy ties take the first", [1.0, 3.0, 3.0, 2.0], {"temperature": 0.0}),
    ("everything filtered but one", [0.0, 50.0, 0.0, 0.0], {"top_p": 0.9, "min_p": 0.5}),
]


@pytest.mark.parametrize("name,values,kw", EDGE_ROWS, ids=[e[0] for e in EDGE_ROWS])
@pytest.mark.parametrize("rejection", [False, True])
def test_edge_cases_match_exactly(native, name, values, kw, rejection):
    logits, params, ids, meta = _row(values, **kw)
    n = 400  # many uniforms over one row: every part of its distribution is drawn
    us = np.random.default_rng(5).random((n, 5 if rejection else 1))
    rep = lambda a: np.repeat(a, n, axis=0)  # noqa: E731
    meta = np.zeros((n, 4), dtype=np.int64)
    got = native.sample(rep(logits), rep(params), ids, meta, us, rejection)
    want = R.sample(rep(logits), rep(params), ids, meta, us, rejection)
    np.testing.assert_array_equal(got, want)
    if not R.is_greedy(params[0, 0], params[0, 1]):
        assert (ref_probs(logits[0], params[0]) > 0)[got].all()


def test_penalties_and_bans_exact(native):
    # Repetition on a positive and a negative logit, frequency * count + presence, and a ban; greedy.
    logits = np.array([[2.0, -2.0, 1.2, 0.5, 3.0, 2.9]], dtype=np.float32)
    ids = np.array([0, 1, 4, 4, 5], dtype=np.int64)  # prompt [0], output [1, 4, 4], banned [5]
    meta = np.array([[0, 1, 3, 1]], dtype=np.int64)
    params = np.array([[0.0, 0, 1.0, 0.0, 2.0, 0.5, 0.25]])
    # 0: 2/2 = 1; 1: -2*2 - 0.75 = -4.75; 4: 3/2 - (0.5 + 0.5) = 0.5; 5 banned -> argmax is token 2.
    for impl in (native, R):
        assert impl.sample(logits, params, ids, meta, np.zeros((1, 1))).tolist() == [2]
    # No frequency penalty and token 2 lowered: token 4 is 1.5 - 0.5 = 1.0, tied with token 0 -> the first.
    params[0, 6] = 0.0
    logits[0, 2] = 0.9
    for impl in (native, R):
        assert impl.sample(logits, params, ids, meta, np.zeros((1, 1))).tolist() == [0]


def _frequencies(native, logits, params, n, rejection, seed):
    nu = 5 if rejection else 1
    us = np.random.default_rng(seed).random((n, nu))
    meta = np.zeros((n, 4), dtype=np.int64)
    toks = native.sample(
        np.repeat(logits, n, axis=0), np.repeat(params, n, axis=0), np.zeros(1, np.int64), meta, us, rejection
    )
    return np.bincount(toks, minlength=logits.shape[1])


@pytest.mark.parametrize("rejection", [False, True])
@pytest.mark.parametrize(
    "kw",
    [
        {"top_k": 5, "top_p": 0.8},
        {"top_p": 0.8, "min_p": 0.05, "temperature": 1.2},
        {"top_k": 3, "temperature": 2.0},  # flat: the kept set has little of the mass, rejection falls back
    ],
)
def test_draws_follow_the_filtered_distribution(native, kw, rejection):
    values = np.random.default_rng(3).standard_normal(24) * 0.8
    logits, params, _, _ = _row(values, **kw)
    p = ref_probs(logits[0], params[0])
    assert (p > 0).sum() >= 3  # a real distribution to compare
    n = 40000
    counts = _frequencies(native, logits, params, n, rejection, seed=11)
    assert counts[p == 0].sum() == 0  # nothing outside the kept set
    kept = p > 0
    chi2 = float((((counts[kept] - n * p[kept]) ** 2) / (n * p[kept])).sum())
    df = int(kept.sum()) - 1
    # Chi-square with df degrees of freedom: mean df, sd sqrt(2 df); 6 sd is far in the tail.
    assert chi2 < df + 6 * np.sqrt(2 * df), (chi2, df)
    assert 0.5 * np.abs(counts / n - p).sum() < 0.02  # total variation


def test_rejection_and_exact_sample_the_same_distribution(native):
    values = np.random.default_rng(4).standard_normal(16) * 2
    logits, params, _, _ = _row(values, top_k=6, top_p=0.85, temperature=0.9)
    n = 40000
    exact = _frequencies(native, logits, params, n, False, seed=21) / n
    rej = _frequencies(native, logits, params, n, True, seed=22) / n
    assert 0.5 * np.abs(exact - rej).sum() < 0.02


def test_bad_layout_is_a_clear_error(native):
    logits, params, ids, meta = _row([1.0, 2.0])
    meta[0] = (0, 5, 0, 0)  # five prompt ids, but ids holds one
    with pytest.raises(ValueError, match="outside the ids tensor"):
        native.sample(logits, params, ids, meta, np.zeros((1, 1)))
    with pytest.raises(ValueError, match="params must be"):
        native.sample(logits, params[:, :3], ids, np.zeros((1, 4), np.int64), np.zeros((1, 1)))


@pytest.mark.parametrize("vocab", [1, 15, 16, 17, 255, 257, 1000, 49152 + 7])
def test_greedy_rows_without_ids_take_the_first_argmax(native, vocab):
    """Greedy rows with no penalty or ban ids take the argmax in place (no padded copy): the first maximum
    wherever it lies (the vector body, the tail, ties across them), 0 when every logit is -inf."""
    rng = np.random.default_rng(vocab)
    rows = [rng.standard_normal(vocab).astype(np.float32) for _ in range(4)]
    rows[1][-1] = 100.0  # the maximum in the tail
    rows[2][:] = 1.0  # ties everywhere: the first
    rows[3][:] = -np.inf
    for at in sorted({0, vocab // 2, vocab - 1}):
        row = rng.standard_normal(vocab).astype(np.float32)
        row[at] = row[-1] = 50.0  # tied with the last: the first of them
        rows.append(row)
    logits = np.stack(rows)
    b = logits.shape[0]
    params = np.tile(np.array([0.0, 0, 1.0, 0.0, 1.0, 0.0, 0.0]), (b, 1))
    ids, meta, us = np.zeros(1, dtype=np.int64), np.zeros((b, 4), dtype=np.int64), np.zeros((b, 1))
    got = native.sample(logits, params, ids, meta, us)
    np.testing.assert_array_equal(got, R.sample(logits, params, ids, meta, us))
    np.testing.assert_array_equal(got, logits.argmax(axis=1))
