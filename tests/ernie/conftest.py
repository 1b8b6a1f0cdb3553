"""Tiny ERNIE-4.5 checkpoints (dense and MoE) built with transformers once per session, and tests/ on
sys.path so `tiny_models` imports."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "2")  # before paddle is imported: it would default to 1
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pytest  # noqa: E402
import tiny_models  # noqa: E402
from ernie_archs import OVERRIDES  # noqa: E402
from ops_backend import switched_ops  # noqa: E402


@pytest.fixture(scope="session")
def ernie_checkpoint(tmp_path_factory):
    """ernie_checkpoint(arch) -> folder with config.json, model.safetensors and a tiny tokenizer."""
    cache: dict[str, Path] = {}

    def build(arch: str) -> Path:
        if arch not in cache:
            folder = tmp_path_factory.mktemp(arch.lower())
            tiny_models.make_tiny_checkpoint(arch, folder, **OVERRIDES[arch])
            tiny_models.write_tiny_tokenizer(folder)
            cache[arch] = folder
        return cache[arch]

    return build


@pytest.fixture(scope="module", autouse=True)
def reference_ops():
    """Model tests compare the reference ops against transformers (the kernels have their own tests)."""
    yield from switched_ops("reference")
