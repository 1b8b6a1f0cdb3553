"""Fixtures for the server tests: a tiny random Llama and one module-wide `fd serve` with an API key, so
every test also exercises auth through the official `openai` SDK. Tests that kill or drain a server
start their own with `fd_server.start_server`."""

from __future__ import annotations

import pytest
from fd_server import make_tiny_model, start_server


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def server(tiny_model, tmp_path_factory):
    srv = start_server(tiny_model, tmp_path_factory.mktemp("srv"), "--served-model-name", "tiny")
    yield srv
    assert srv.stop() == 0, srv.log.read_text()[-3000:]
