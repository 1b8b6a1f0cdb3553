"""Prompt-lookup drafting against hand-worked histories."""

from __future__ import annotations

import numpy as np
import pytest

from fdcli_engine.runner.ngram_proposer import ngram_drafts


def drafts(history, n_min=1, n_max=3, k=3):
    return ngram_drafts(np.asarray(history, dtype=np.int64), n_min, n_max, k)


@pytest.mark.parametrize(
    "history, want",
    [
        ([1, 2, 3, 4, 9, 1, 2, 3], [4, 9, 1]),  # suffix 1 2 3 seen at 0: what followed it
        ([1, 2, 3, 4, 9, 5, 2, 3], [4, 9, 5]),  # only the 2-gram 2 3 matches
        ([7, 8, 5, 1, 8, 6, 8], [6, 8]),  # 1-gram 8: the latest earlier match (at 4), up to the end
        ([1, 2, 3, 4, 5], []),  # 5 never appeared before
        ([4], []),
        ([3, 3], [3]),
    ],
)
def test_latest_longest_match(history, want):
    assert drafts(history) == want


def test_min_length_and_k():
    assert drafts([5, 1, 2, 9, 2], n_min=2) == []  # the 1-gram "2" matches, but 2 tokens are required
    assert drafts([1, 2, 3, 4, 5, 6, 1, 2], k=2) == [3, 4]
    assert drafts([1, 2, 3, 1, 2, 3, 1, 2], n_max=5, k=4) == [
        3,
        1,
        2,
    ]  # the 5-gram 1 2 3 1 2 seen at 0; 3 tokens follow
