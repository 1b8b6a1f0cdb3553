"""vLLM's launch flags end to end through `fd serve` and the official openai SDK: several served model
names (the first reported, all listed and accepted, any other a 404), --max-logprobs (a 400 above
it), --enable-request-id-headers and --root-path."""

from __future__ import annotations

import openai
import pytest
from fd_server import start_server


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
