"""The engine-side pooler on hand-made hidden states: each pooling type's rows, the head applied once
per batch, STEP with and without tags, returned_token_ids; and the front-end postprocess."""

from __future__ import annotations

import numpy as np
import pytest

from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.pooling.config import PoolerConfig
from fdcli_engine.pooling.pooler import pool
from fdcli_engine.pooling.postprocess import check_dimensions, postprocess

HIDDEN = np.arange(15, dtype=np.float32).reshape(5, 3)  # rows 0-1: sequence a, rows 2-4: sequence b
STARTS = np.array([0, 2, 5])
IDS = [[7, 9], [9, 1, 9]]


def pc(kind, **kw):
    return PoolerConfig(task=kw.pop("task", "embed"), pooling_type=kind, normalize=False, softmax=False, **kw)


@pytest.mark.parametrize(
    ("kind", "want"),
    [
        ("LAST", [HIDDEN[1], HIDDEN[4]]),
        ("CLS", [HIDDEN[0], HIDDEN[2]]),
        ("MEAN", [HIDDEN[:2].mean(0), HIDDEN[2:].mean(0)]),
        ("ALL", [HIDDEN[:2], HIDDEN[2:]]),
        ("STEP", [HIDDEN[:2], HIDDEN[2:]]),  # no step_tag_id: every position
    ],
)
def test_pooling_types(kind, want):
    for got, w in zip(pool(HIDDEN, STARTS, IDS, pc(kind)), want):
        np.testing.assert_array_equal(got, w)


def test_step_rows_at_tags_then_head_and_returned_token_ids():
    calls = []

    def head(x):
        calls.append(x.shape)
        return np.stack([x[:, 0], -x[:, 0], x[:, 2]], axis=1)

    out = pool(
        HIDDEN, STARTS, IDS, pc("STEP", task="process_reward", step_tag_id=9, returned_token_ids=[2, 0]), head
    )
    assert calls == [(3, 3)]  # one head call for the batch: row 1 of a, rows 2 and 4 of b
    np.testing.assert_array_equal(out[0], [[5.0, 3.0]])
    np.testing.assert_array_equal(out[1], [[8.0, 6.0], [14.0, 12.0]])
    empty = pool(HIDDEN, STARTS, [[1, 1], [1, 1, 1]], pc("STEP", step_tag_id=9), head)
    assert [e.shape[0] for e in empty] == [0, 0]


def test_postprocess_normalize_softmax_and_dimensions():
    x = np.array([3.0, 4.0, 12.0], dtype=np.float32)
    np.testing.assert_allclose(postprocess(x, _norm()), x / 13.0)
    np.testing.assert_allclose(postprocess(x, _norm(), dimensions=2), [0.6, 0.8])
    np.testing.assert_array_equal(postprocess(x, _norm(), normalize=False), x)
    sm = postprocess(np.array([[0.0, np.log(3.0)]]), PoolerConfig("process_reward", "STEP", False, True))
    np.testing.assert_allclose(sm, [[0.25, 0.75]], rtol=1e-6)
    with pytest.raises(InvalidRequestError, match="matryoshka"):
        check_dimensions(2, _norm(), 3)
    with pytest.raises(InvalidRequestError, match="between 1 and 3"):
        check_dimensions(4, PoolerConfig("embed", "LAST", True, False, is_matryoshka=True), 3)


def _norm():
    return PoolerConfig("embed", "LAST", True, False)
