"""Tiny checkpoints with tokenizers, and engines over them, built once per session."""

from __future__ import annotations

import pytest
import tiny_models


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    cache = {}

    def build(arch: str = "LlamaForCausalLM"):
        if arch not in cache:
            folder = tmp_path_factory.mktemp(arch.lower())
            tiny_models.make_tiny_checkpoint(arch, folder)
            tiny_models.write_tiny_tokenizer(folder)
            cache[arch] = folder
        return cache[arch]

    return build
