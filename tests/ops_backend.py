"""The fixture body of every test module that runs on each implementation of fd's ops: bind `ops.use(name)`
for the test and bind the previous implementation again after it, so no test leaks its choice."""

from __future__ import annotations


def switched_ops(name: str):
    """Generator for a fixture (`yield from switched_ops(request.param)`): yields the bound backend's name."""
    from fdcli_engine import ops

    previous = ops.backend
    chosen = ops.use(name)
    try:
        yield chosen
    finally:
        ops.use(previous)
