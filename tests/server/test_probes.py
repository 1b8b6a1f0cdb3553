"""/health and /ping on the FastAPI app over the scripted engine: 503 (an OpenAI error object) while the
engine still loads the model, as vLLM's server, which answers only once its engine is ready; 200 once
it serves; 503 when it died; "degraded" 200 while some data-parallel ranks serve. /ping takes GET and
POST (vLLM's SageMaker probe), and neither probe needs the API key."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from scripted import ScriptedEngine

from fdcli_engine.entrypoints.openai.app_state import Admission, AppState, ServerArgs
from fdcli_engine.entrypoints.openai.http_app import build_app

KEY = "k-probe"


def _http(engine) -> TestClient:
    args = ServerArgs(api_keys=[KEY])
    return TestClient(build_app(engine, args, AppState(args, Admission(4, -1))))


PROBES = [("GET", "/health"), ("GET", "/ping"), ("POST", "/ping")]


@pytest.mark.parametrize("method, path", PROBES)
def test_probe_is_503_while_loading_then_200(method, path):
    engine = ScriptedEngine(None, is_ready=False)
    http = _http(engine)
    r = http.request(method, path)  # no key: the probes are open
    assert r.status_code == 503
    assert r.json()["error"]["message"] == "the engine is still loading the model"
    assert r.headers["retry-after"] == "5"
    # a real request says the same meanwhile
    assert http.get("/ready", headers={"Authorization": f"Bearer {KEY}"}).status_code == 503
    engine.is_ready = True
    r = http.request(method, path)
    assert (r.status_code, r.content) == (200, b"")


@pytest.mark.parametrize("method, path", PROBES)
def test_probe_is_503_when_the_engine_died(method, path):
    engine = ScriptedEngine(None, is_ready=False, is_dead=True, dead_reason="core exited with 9")
    r = _http(engine).request(method, path)
    assert r.status_code == 503
    assert r.json()["error"]["message"] == "the engine is not running: core exited with 9"


def test_probe_is_degraded_200_while_some_ranks_serve():
    engine = ScriptedEngine(None)
    engine.dead_ranks = {1: "killed"}
    r = _http(engine).get("/health")
    assert r.status_code == 200
    assert r.json() == {"status": "degraded", "dead_ranks": [{"rank": 1, "reason": "killed"}]}


def test_other_methods_on_the_probes_are_405():
    http = _http(ScriptedEngine(None))
    assert http.post("/health").status_code == 405
    assert http.put("/ping").status_code == 405
