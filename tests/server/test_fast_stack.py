"""fd serve runs on uvloop and httptools when they are installed (they are dependencies) and falls back to
asyncio's loop and h11 when they are not."""

from __future__ import annotations

import asyncio
import sys

import pytest

from fdcli_engine.entrypoints.event_loop import event_loop_runner
from fdcli_engine.entrypoints.openai.app_state import ServerArgs
from fdcli_engine.entrypoints.openai.launcher import http_protocol, uvicorn_config


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_uses_uvloop_and_httptools_when_installed():
    pytest.importorskip("uvloop")
    pytest.importorskip("httptools")
    with event_loop_runner() as runner:
        assert runner.run(_loop_module()).startswith("uvloop")
    assert http_protocol() == "httptools"
    config = uvicorn_config(object(), ServerArgs())
    config.load()  # resolves the protocol class, as uvicorn does before serving
    assert config.http_protocol_class.inner_class.__module__ == "uvicorn.protocols.http.httptools_impl"


def test_falls_back_to_asyncio_and_h11(monkeypatch):
    # A None entry in sys.modules makes `import name` raise ImportError, as when it is not installed.
    monkeypatch.setitem(sys.modules, "uvloop", None)
    monkeypatch.setitem(sys.modules, "httptools", None)
    with event_loop_runner() as runner:
        assert runner.run(_loop_module()).startswith("asyncio")
    assert http_protocol() == "h11"
    config = uvicorn_config(object(), ServerArgs())
    config.load()
    assert config.http_protocol_class.inner_class.__module__ == "uvicorn.protocols.http.h11_impl"
