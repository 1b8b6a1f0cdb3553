"""Helpers the kernel tests import. Not in conftest.py: a test importing `conftest` gets whichever
directory's conftest pytest loaded last when several test directories are collected in one run."""

from __future__ import annotations

import numpy as np


def to_pd(a):
    import paddle

    return paddle.to_tensor(np.ascontiguousarray(a))


def to_rows(mask):
    """The `prompt_rows` argument of the native linear for a bool [T] mask: uint8, None when no row is
    set (as the model runner builds it, runner/input_batch.prompt_rows_tensor)."""
    mask = np.asarray(mask, dtype=bool)
    return to_pd(mask.astype(np.uint8)) if mask.any() else None
