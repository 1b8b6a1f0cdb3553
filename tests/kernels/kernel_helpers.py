"""Helpers the kernel tests import. Not in conftest.py: a test importing `conftest` gets whichever
directory's conftest pytest loaded last when several test directories are collected in one run."""

from __future__ import annotations

import numpy as np


def to_pd(a):
    import paddle

    return paddle.to_tensor(np.ascontiguousarray(a))
