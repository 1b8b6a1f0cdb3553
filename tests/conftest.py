"""Shared test set-up: tests/ on sys.path (tiny_models, scripted), threads claimed before paddle loads,
the tiny tokenizer, one tiny-model `fd serve` and one SmolLM2 `fd serve` for every test that only
sends them requests."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture
def launched_args(monkeypatch):
    """The ServerArgs of each `fd serve` the test invokes through the CLI, in order; the launcher's
    run_server is replaced, so nothing loads or listens."""
    calls = []
    monkeypatch.setattr(
        "fdcli_engine.entrypoints.openai.launcher.run_server",
        lambda config, args, **kw: calls.append(args) or 0,
    )
    return calls


@pytest.fixture
def captured(monkeypatch):
    """(EngineConfig, ServerArgs) of each `fd serve` the test invokes through the CLI, in order; as
    launched_args, nothing loads or listens."""
    calls = []
    monkeypatch.setattr(
        "fdcli_engine.entrypoints.openai.launcher.run_server",
        lambda config, args, **kw: calls.append((config, args)) or 0,
    )
    return calls


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory):
    """The tiny ChatML BPE tokenizer of tiny_models, for scripted-engine tests (a module may override)."""
    from tiny_models import write_tiny_tokenizer

    from fdcli_engine.tokenizer import Tokenizer

    return Tokenizer.from_model(write_tiny_tokenizer(tmp_path_factory.mktemp("tok")))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A tiny random Llama checkpoint with the tiny tokenizer (tests/server/fd_server.py)."""
    from server.fd_server import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def server(tiny_model, tmp_path_factory):
    """One `fd serve` of `tiny_model` (served as "tiny", with an API key, so every test also exercises
    auth) for the whole run: tests that only send requests share it. Tests that kill, drain or
    reconfigure a server start their own with `fd_server.start_server`."""
    from server.fd_server import start_server

    srv = start_server(tiny_model, tmp_path_factory.mktemp("srv"), "--served-model-name", "tiny")
    yield srv
    assert srv.stop() == 0, srv.log.read_text()[-3000:]


SMOL_NAME = "SmolLM2-135M-Instruct"  # the name smol_server serves the default model under


@pytest.fixture(scope="session")
def smol_server(tmp_path_factory):
    """One `fd serve` of the real SmolLM2 (no --model) for every test that only sends it requests, with
    the hermes tool parser (requests without tools never reach it); skipped where the model is not
    installed."""
    from server.fd_server import start_server

    from fdcli_engine.config import default_model_path

    try:
        default_model_path()
    except Exception as e:  # noqa: BLE001
        pytest.skip(str(e))
    srv = start_server(
        None, tmp_path_factory.mktemp("smol"), "--max-model-len", "2048",
        "--tool-call-parser", "hermes", "--served-model-name", SMOL_NAME,
    )  # fmt: skip
    yield srv
    assert srv.stop() == 0, srv.log.read_text()[-3000:]


@pytest.fixture(scope="session")
def smollm2_hf():
    """transformers' own model of the SmolLM2 GGUF (it dequantizes the blocks; fp32, eager attention),
    the reference of every SmolLM2 comparison: loaded once per run, since dequantizing takes a while."""
    import torch
    from transformers import AutoModelForCausalLM

    from fdcli_engine.config import default_model_path

    path = default_model_path()
    return AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
    ).eval()
