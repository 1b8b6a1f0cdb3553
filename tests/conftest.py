"""Shared test set-up: tests/ on sys.path (tiny_models, scripted), threads claimed before paddle loads,
the tiny tokenizer fixture."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory):
    """The tiny ChatML BPE tokenizer of tiny_models, for scripted-engine tests (a module may override)."""
    from tiny_models import write_tiny_tokenizer

    from fdcli_engine.tokenizer import Tokenizer

    return Tokenizer.from_model(write_tiny_tokenizer(tmp_path_factory.mktemp("tok")))
