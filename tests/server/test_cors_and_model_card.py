"""CORS (vLLM's --allowed-origins/--allowed-methods/--allowed-headers/--allow-credentials) and
GET /v1/models/{id}, on the FastAPI app over the scripted engine, plus the flags' parsing in `fd serve`
(the server itself patched out)."""

from __future__ import annotations

import openai
import pytest
from fastapi.testclient import TestClient
from scripted import ModelConfig, ScriptedEngine
from typer.testing import CliRunner

from fdcli.main import app as cli_app
from fdcli_engine.entrypoints.openai.app_state import Admission, AppState, ServerArgs
from fdcli_engine.entrypoints.openai.http_app import build_app
from fdcli_engine.entrypoints.openai.serving_options import ServingOptions

KEY = "k-123"
ORIGIN = "http://localhost:3000"
CARD = ModelConfig("org/tiny", max_model_len=512, vocab_size=300, model="/models/tiny")
PREFLIGHT = {
    "Origin": ORIGIN,
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization,content-type",
}


def _http(**args) -> TestClient:
    server = ServerArgs(
        api_keys=[KEY], serving=ServingOptions(served_model_names=["org/tiny", "alias"]), **args
    )
    return TestClient(
        build_app(ScriptedEngine(None, model_config=CARD), server, AppState(server, Admission(4, -1)))
    )


def test_model_card_by_id_through_the_sdk():
    client = openai.OpenAI(base_url="http://testserver/v1", api_key=KEY, http_client=_http())
    card = client.models.retrieve("org/tiny")  # an id with a slash, as HF names are
    assert (card.id, card.object, card.owned_by) == ("org/tiny", "model", "fd")
    assert card.model_dump()["max_model_len"] == 512 and card.model_dump()["root"] == "/models/tiny"
    assert client.models.retrieve("alias").id == "alias"
    assert [m.id for m in client.models.list()] == ["org/tiny", "alias"]
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("nope")
    assert e.value.body["code"] == "model_not_found" and "org/tiny" in e.value.body["message"]


def test_no_cors_headers_by_default():
    http = _http()
    r = http.options("/v1/chat/completions", headers=PREFLIGHT)
    assert "access-control-allow-origin" not in r.headers
    r = http.get("/v1/models", headers={"Origin": ORIGIN, "Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_preflight_needs_no_key_and_the_request_still_does():
    http = _http(allowed_origins=[ORIGIN])
    r = http.options("/v1/chat/completions", headers=PREFLIGHT)
    assert r.status_code == 200, r.text
    assert r.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in r.headers["access-control-allow-methods"]
    assert "authorization" in r.headers["access-control-allow-headers"].lower()
    assert "access-control-allow-credentials" not in r.headers
    r = http.get("/v1/models", headers={"Origin": ORIGIN})
    assert r.status_code == 401 and r.headers["access-control-allow-origin"] == ORIGIN  # readable 401
    r = http.get("/v1/models", headers={"Origin": ORIGIN, "Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN


def test_other_origins_methods_and_credentials():
    http = _http(allowed_origins=[ORIGIN], allowed_methods=["GET"], allow_credentials=True)
    r = http.options("/v1/models", headers={**PREFLIGHT, "Origin": "http://evil.example"})
    assert r.status_code == 400 and "access-control-allow-origin" not in r.headers
    r = http.options("/v1/models", headers=PREFLIGHT)  # POST is not allowed
    assert r.status_code == 400
    r = http.options("/v1/models", headers={**PREFLIGHT, "Access-Control-Request-Method": "GET"})
    assert r.status_code == 200 and r.headers["access-control-allow-credentials"] == "true"


def test_wildcard_origin():
    r = _http(allowed_origins=["*"]).options("/v1/completions", headers=PREFLIGHT)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"


# ---- fd serve flags and --config ----

runner = CliRunner()


def test_cors_flags_and_yaml(launched_args, tmp_path):
    r = runner.invoke(
        cli_app,
        [
            "serve",
            "--allowed-origins",
            f'["{ORIGIN}"]',
            "--allowed-methods",
            '["GET", "POST"]',
            "--allow-credentials",
        ],
    )
    assert r.exit_code == 0, r.output
    args = launched_args[-1]
    assert (args.allowed_origins, args.allowed_methods, args.allowed_headers, args.allow_credentials) == (
        [ORIGIN],
        ["GET", "POST"],
        ["*"],
        True,
    )
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(
        f"allowed-origins: ['{ORIGIN}']\nallowed_headers: '[\"authorization\"]'\nallow-credentials: false\n"
    )
    r = runner.invoke(cli_app, ["serve", "--config", str(cfg)])
    assert r.exit_code == 0, r.output
    args = launched_args[-1]
    assert (args.allowed_origins, args.allowed_headers, args.allow_credentials) == (
        [ORIGIN],
        ["authorization"],
        False,
    )
    r = runner.invoke(cli_app, ["serve"])
    assert launched_args[-1].allowed_origins is None  # no CORS unless asked for


@pytest.mark.parametrize(
    "argv",
    [
        ["--allowed-origins", "http://localhost:3000"],
        ["--allowed-origins", '{"a": 1}'],
        ["--allowed-headers", "[1, 2]"],
    ],
)
def test_bad_cors_flag_is_one_line(launched_args, argv):
    r = runner.invoke(cli_app, ["serve", *argv])
    assert r.exit_code == 2 and not launched_args
    assert r.stderr.count("\n") == 1 and argv[0] in r.stderr and "JSON list" in r.stderr, r.stderr
