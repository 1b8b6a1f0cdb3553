"""The fixture body of every test module that runs on each implementation of fd's ops: bind `ops.use(name)`
for the test and bind the previous implementation again after it, so no test leaks its choice."""

from __future__ import annotations

import pytest


def switched_ops(name: str):
    """Generator for a fixture (`yield from switched_ops(request.param)`): yields the bound backend's name.
    Skips where "native" is asked for and the C++ kernels cannot load (tests/kernels/test_build.py is the
    test that fails then)."""
    from fdcli_engine import ops

    previous = ops.backend
    try:
        chosen = ops.use(name)
    except RuntimeError as exc:
        pytest.skip(f"C++ kernels unavailable: {exc}")
    try:
        yield chosen
    finally:
        ops.use(previous)
