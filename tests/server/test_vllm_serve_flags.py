"""vLLM's launch flags end to end through `fd serve` and the official openai SDK: several served model
names (the first reported, all listed and accepted, any other a 404), --max-logprobs (a 400 above
it), --enable-request-id-headers and --root-path; HTTPS (--ssl-keyfile/--ssl-certfile, uvicorn's),
--disable-fastapi-docs, --enable-force-include-usage (usage on every chunk of a stream and at its end, as
vLLM's should_include_usage), --enable-server-load-tracking (GET /load) and --log-config-file
(logging.config.dictConfig, for uvicorn's loggers and fd's)."""

from __future__ import annotations

import json
import logging
import ssl
import subprocess

import httpx
import openai
import pytest
from fd_server import start_server
from inproc_app import inproc_app

from fdcli_engine.entrypoints.openai.app_state import ServerArgs
from fdcli_engine.entrypoints.openai.serving_options import ServingOptions


@pytest.fixture(scope="module")
def vllm_server(tiny_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm-flags")
    server = start_server(
        None,
        tmp,
        str(tiny_model),  # vllm serve MODEL: the positional model
        "--served-model-name", "first", "second",
        "--max-logprobs", "2",
        "--enable-request-id-headers",
        "--root-path", "/llm",
        "--trust-remote-code",
        "--disable-uvicorn-access-log",
    )  # fmt: skip
    yield server
    server.stop()


def test_every_served_name_is_listed_and_accepted(vllm_server):
    client = vllm_server.client()
    assert [m.id for m in client.models.list().data] == ["first", "second"]
    for name in ("first", "second"):
        out = client.completions.create(model=name, prompt="hello", max_tokens=2, temperature=0)
        assert out.model == "first"  # vLLM reports the first name
        chat = client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        assert chat.model == "first" and chat.choices[0].message.content is not None
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="third", prompt="hello", max_tokens=2)
    assert e.value.body["code"] == "model_not_found" and "first, second" in e.value.body["message"]


def test_max_logprobs_is_a_400_above_it(vllm_server):
    client = vllm_server.client()
    out = client.completions.create(model="first", prompt="hello", max_tokens=1, logprobs=2)
    assert len(out.choices[0].logprobs.top_logprobs[0]) >= 2
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="first", prompt="hello", max_tokens=1, logprobs=3)
    assert "--max-logprobs 2" in e.value.body["message"] and e.value.body["param"] == "logprobs"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="second", messages=[{"role": "user", "content": "hi"}], logprobs=True, top_logprobs=3
        )
    assert e.value.body["param"] == "top_logprobs"


def test_request_id_header_and_root_path(vllm_server):
    with vllm_server.http() as h:
        r = h.get("/v1/models", headers={"X-Request-Id": "abc-123"})
        assert r.status_code == 200 and r.headers["x-request-id"] == "abc-123"
        r = h.get("/v1/models")
        assert len(r.headers["x-request-id"]) == 32  # a fresh id when the client sent none
        r = h.get("/openapi.json")  # FastAPI names the prefix the proxy serves it under
        assert r.status_code == 200 and r.json()["servers"] == [{"url": "/llm"}]
    log = vllm_server.log.read_text()
    assert "--trust-remote-code has no effect: fd never runs code from a checkpoint" in log
    assert "--disable-uvicorn-access-log has no effect" in log


CHAT = [{"role": "user", "content": "Hi"}]


def _self_signed(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


def test_https_with_vllm_ssl_flags(tiny_model, tmp_path):
    cert, key = _self_signed(tmp_path)
    server = start_server(
        tiny_model,
        tmp_path,
        "--ssl-certfile",
        str(cert),
        "--ssl-keyfile",
        str(key),
        "--served-model-name",
        "tiny",
    )
    try:
        client = openai.OpenAI(
            base_url=f"{server.url}/v1",
            api_key=server.api_key,
            max_retries=0,
            http_client=httpx.Client(verify=ssl.create_default_context(cafile=str(cert))),
        )
        out = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=3)
        assert server.url.startswith("https://") and out.usage.completion_tokens == 3
        with pytest.raises(httpx.HTTPError):  # plain HTTP is not served on the port
            httpx.get(f"http://127.0.0.1:{server.port}/health", timeout=5)
    finally:
        server.stop()


def test_force_include_usage_docs_and_load(tiny_model):
    serving = ServingOptions(served_model_names=["tiny"], enable_force_include_usage=True)
    server = {"disable_fastapi_docs": True, "enable_server_load_tracking": True}
    with inproc_app(tiny_model, serving, server) as (client, http):
        for stream in (
            client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=4, stream=True),
            client.completions.create(model="tiny", prompt="Hi", max_tokens=4, stream=True),
        ):
            chunks = list(stream)  # no stream_options: the flag alone asks for usage
            assert all(c.usage is not None for c in chunks)
            assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4
        for path in ("/docs", "/redoc", "/openapi.json"):
            assert http.get(path).status_code == 404
        state = next(m.kwargs["state"] for m in http.app.user_middleware if "state" in m.kwargs)
        assert http.get("/load").json() == {"server_load": 0}
        state.admission.inflight = 3  # requests being served (admitted, response not finished)
        assert http.get("/load").json() == {"server_load": 3}
        state.admission.inflight = 0
    with inproc_app(tiny_model, ServingOptions(served_model_names=["tiny"])) as (client, http):
        chunks = list(client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=2, stream=True))
        assert all(c.usage is None for c in chunks)  # without the flag: as the request asks
        state = next(m.kwargs["state"] for m in http.app.user_middleware if "state" in m.kwargs)
        state.admission.inflight = 3
        assert http.get("/load").json() == {"server_load": 0}  # vLLM counts only under the flag
        state.admission.inflight = 0
        assert http.get("/docs").status_code == 200


def test_log_config_file_configures_fd_and_uvicorn_loggers(tmp_path):
    from fastapi import FastAPI

    from fdcli_engine.entrypoints.openai.launcher import uvicorn_config

    conf = tmp_path / "log.json"
    conf.write_text(
        json.dumps(
            {
                "version": 1,
                "disable_existing_loggers": False,
                "handlers": {"file": {"class": "logging.FileHandler", "filename": str(tmp_path / "fd.log")}},
                "loggers": {"fd": {"level": "ERROR", "handlers": ["file"]}, "uvicorn": {"level": "ERROR"}},
            }
        )
    )
    fd_logger = logging.getLogger("fd")
    saved = (fd_logger.level, list(fd_logger.handlers))
    try:
        uvicorn_config(FastAPI(), ServerArgs(log_config_file=str(conf))).configure_logging()
        assert fd_logger.level == logging.ERROR and logging.getLogger("uvicorn").level == logging.ERROR
        fd_logger.error("written by the config's handler")
        assert "written by the config's handler" in (tmp_path / "fd.log").read_text()
    finally:
        for h in fd_logger.handlers:
            if h not in saved[1]:
                fd_logger.removeHandler(h)
                h.close()
        fd_logger.setLevel(saved[0])
