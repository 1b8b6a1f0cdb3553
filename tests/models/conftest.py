"""Fixtures for model tests: tiny checkpoints built once per session, and tests/ on sys.path so
`tiny_models` imports."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "2")  # before paddle is imported: it would default to 1
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pytest  # noqa: E402
import tiny_models  # noqa: E402
from ops_backend import switched_ops  # noqa: E402


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """tiny_checkpoint(arch, **overrides) -> folder; each distinct request is built once."""
    cache: dict[tuple, Path] = {}

    def build(arch: str, **overrides) -> Path:
        key = (arch, repr(sorted(overrides.items())))
        if key not in cache:
            folder = tmp_path_factory.mktemp(arch.lower())
            cache[key] = tiny_models.make_tiny_checkpoint(arch, folder, **overrides)
        return cache[key]

    return build


@pytest.fixture(autouse=True)
def reference_ops():
    """Model tests check the reference ops against transformers; native kernels have their own tests."""
    yield from switched_ops("reference")
