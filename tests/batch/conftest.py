"""Fixtures for the run-batch tests: one tiny random Llama (with tokenizer) per session and a shared
EngineCore over it. The helpers that write batch files and run `fd run-batch` are in batch_helpers.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from batch_helpers import ENGINE_ARGS


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    import tiny_models

    folder = tmp_path_factory.mktemp("batch-tiny-llama")
    tiny_models.make_tiny_checkpoint("LlamaForCausalLM", folder, seed=3)
    tiny_models.write_tiny_tokenizer(folder)
    return folder


@pytest.fixture(scope="session")
def shared_core(tiny_model):
    """(EngineCore, tokenizer, config) built once; every run wraps them in a fresh in-process client."""
    from fdcli_engine.config import EngineConfig
    from fdcli_engine.config_resolver import resolve_config
    from fdcli_engine.engine import EngineCore
    from fdcli_engine.tokenizer import load_tokenizer

    config = resolve_config(
        EngineConfig.from_dict({"model": str(tiny_model), "served_model_name": "tiny", **ENGINE_ARGS})
    )
    return EngineCore(config), load_tokenizer(config), config


@pytest.fixture
def engine_factory(shared_core):
    from fdcli_engine.api.inproc_client import InProcessEngineClient

    core, tokenizer, config = shared_core

    def make(_engine_args):
        assert not core.has_unfinished_requests(), "a previous run left requests in the shared core"
        return InProcessEngineClient(config, tokenizer=tokenizer, core=core)

    return make
