"""Fixtures for the C++ kernel tests: the native ops (built once, cached), the pure-Paddle reference ops,
and small helpers. FD_KERNELS_ISA in the environment selects the code path under test (test_isa.py
re-runs this directory under every path the CPU supports)."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("OMP_NUM_THREADS", "2")  # before paddle is imported: it would default to 1


@pytest.fixture(scope="session")
def native():
    from fd_kernels import native

    native.load()
    return native


@pytest.fixture(scope="session")
def ref():
    from fd_kernels import reference

    return reference


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
