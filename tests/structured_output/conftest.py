"""A tiny random llama with its tokenizer, and one engine over it, shared by the module's tests."""

from __future__ import annotations

import pytest
import tiny_models


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("so_llama")
    tiny_models.make_tiny_checkpoint("LlamaForCausalLM", folder)
    tiny_models.write_tiny_tokenizer(folder)
    return folder
