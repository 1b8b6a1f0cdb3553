"""`fd serve`'s FastAPI app over a real engine in this process (InProcessEngineClient), behind the official
openai SDK: for tests that need a ServingOptions a command line cannot give, such as a MediaPolicy with
the test-only loopback allowance so the server fetches pictures from a fixture server on 127.0.0.1."""

from __future__ import annotations

import contextlib
from pathlib import Path

import openai
from fastapi.testclient import TestClient

from fdcli_engine.entrypoints.openai.app_state import Admission, AppState, ServerArgs
from fdcli_engine.entrypoints.openai.http_app import build_app
from fdcli_engine.entrypoints.openai.serving_options import ServingOptions


@contextlib.contextmanager
def inproc_app(model: Path, serving: ServingOptions, server: dict | None = None, **engine_args):
    """(openai client, httpx TestClient) of the app serving `model` in process, for the with-block;
    `server`: ServerArgs fields besides `serving`."""
    from fdcli_engine.api.inproc_client import InProcessEngineClient
    from fdcli_engine.config import EngineConfig
    from fdcli_engine.config_resolver import resolve_config

    defaults = {"num_kv_blocks": 128, "max_num_seqs": 8, "threads": 1}
    config = resolve_config(EngineConfig.from_dict({"model": str(model), **defaults, **engine_args}))
    engine = InProcessEngineClient(config)
    args = ServerArgs(serving=serving, **(server or {}))
    # One TestClient context: one event loop for every request, where the engine's driver runs.
    with TestClient(build_app(engine, args, AppState(args, Admission(8, -1)))) as http:
        client = openai.OpenAI(
            base_url="http://testserver/v1", api_key="none", http_client=http, max_retries=0
        )
        try:
            yield client, http
        finally:
            http.portal.call(engine.shutdown)
