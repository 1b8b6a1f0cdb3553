"""Tiny pooling checkpoints (random weights, built with transformers) shared by the pooling tests."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "2")  # before paddle is imported: it would default to 1
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))

import pytest  # noqa: E402
from ops_backend import switched_ops  # noqa: E402


@pytest.fixture(scope="session")
def pooling_checkpoint(tmp_path_factory):
    """pooling_checkpoint(kind) -> folder with weights, config.json and a tokenizer; built once each."""
    import pooling_models

    cache: dict[str, Path] = {}

    def build(kind: str) -> Path:
        if kind not in cache:
            cache[kind] = pooling_models.BUILDERS[kind](tmp_path_factory.mktemp(kind.lower()))
        return cache[kind]

    return build


@pytest.fixture(autouse=True)
def reference_ops():
    """Pooling tests compare against transformers with the reference ops (kernels have their own tests)."""
    yield from switched_ops("reference")
