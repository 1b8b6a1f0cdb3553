"""`fd router`'s pieces without instances: registration rules, the heartbeat TTL and the pick by load,
the merged /metrics page, a 503 with nobody registered, and the command's one-line errors."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
from fastapi.testclient import TestClient
from fd_server import REPO

from fdcli_engine.entrypoints.openai.router_heartbeat import registration_headers
from fdcli_engine.entrypoints.router.app import build_router_app
from fdcli_engine.entrypoints.router.local_prefill import (
    CHARS_PER_TOKEN_BOUND,
    SPECIAL_TOKENS_BOUND,
    parse_max_local_prefill_length,
    tokenize_body,
)
from fdcli_engine.entrypoints.router.metrics import merge_metrics
from fdcli_engine.entrypoints.router.registry import Registry
from fdcli_engine.kv_transfer.pd.settings import REGISTER_TOKEN_HEADER, TOKEN_ENV


def test_register_checks_its_fields_and_lists_instances():
    with TestClient(build_router_app()) as c:
        assert c.post("/register", json={"role": "x", "url": "http://a:1"}).status_code == 400
        assert c.post("/register", json={"role": "prefill", "url": "a:1"}).status_code == 400
        r = c.post("/register", json={"role": "decode", "url": "http://a:1"})  # no kv_address
        assert r.status_code == 400 and "kv_address" in r.json()["error"]["message"]
        assert c.post("/register", content=b"{nope").status_code == 400
        ok = {"role": "decode", "url": "http://a:1/", "kv_address": "tcp://127.0.0.1:5"}
        assert c.post("/register", json=ok).status_code == 200
        assert c.get("/instances").json()["instances"] == [
            {"role": "decode", "url": "http://a:1", "kv_address": "tcp://127.0.0.1:5", "in_flight": 0}
        ]


def test_register_with_a_token_takes_only_heartbeats_that_carry_it(monkeypatch):
    ok = {"role": "prefill", "url": "http://a:1"}
    with TestClient(build_router_app(register_token="s3cret")) as c:
        for headers in ({}, {REGISTER_TOKEN_HEADER: "wrong"}, {REGISTER_TOKEN_HEADER: ""}):
            r = c.post("/register", json=ok, headers=headers)
            assert r.status_code == 401 and REGISTER_TOKEN_HEADER in r.json()["error"]["message"]
        assert c.get("/instances").json()["instances"] == []
        # an instance's heartbeat sends the token it was given (--kv-transfer-token lands in its env)
        monkeypatch.setenv(TOKEN_ENV, "s3cret")
        assert c.post("/register", json=ok, headers=registration_headers()).status_code == 200
        assert [i["url"] for i in c.get("/instances").json()["instances"]] == ["http://a:1"]
    monkeypatch.delenv(TOKEN_ENV)
    assert registration_headers() == {}


def test_a_router_beyond_loopback_needs_a_token():
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    p = subprocess.run(
        [sys.executable, "-m", "fdcli.main", "router", "--host", "0.0.0.0", "--port", "1"],
        capture_output=True, text=True, cwd=REPO, timeout=60, env=env,
    )  # fmt: skip
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "--kv-transfer-token" in p.stderr and "Traceback" not in p.stderr


def test_nobody_registered_is_a_503_error_object():
    with TestClient(build_router_app()) as c:
        r = c.post("/v1/completions", json={"model": "m", "prompt": "hi"})
        assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable"
        assert c.get("/health").status_code == 503
        assert c.get("/v1/models").status_code == 503


def test_silent_instances_are_forgotten_and_picks_go_by_load():
    reg = Registry(ttl_s=0.3)
    a = reg.register("prefill", "http://a:1")
    b = reg.register("prefill", "http://b:1")
    assert reg.pick("prefill") is a
    a.in_flight = 2
    assert reg.pick("prefill") is b
    assert reg.pick("prefill", exclude={"http://b:1"}) is a
    assert reg.pick("decode") is None
    time.sleep(0.4)
    reg.register("prefill", "http://b:1")  # b heartbeats, a does not
    assert [i.url for i in reg.live()] == ["http://b:1"]


def test_a_failed_instance_ignores_its_own_late_heartbeat_for_a_while():
    reg = Registry(quarantine_s=0.3)
    d = reg.register("decode", "http://d:1", "ipc:///tmp/x")
    reg.forget(d)  # a call to it failed
    assert reg.register("decode", "http://d:1", "ipc:///tmp/x") is None and reg.live() == []
    time.sleep(0.4)
    assert reg.register("decode", "http://d:1", "ipc:///tmp/x") is not None and len(reg.live()) == 1


def test_metrics_pages_merge_under_one_header_with_instance_labels():
    page = (
        "# HELP fd:x Things\n# TYPE fd:x counter\nfd:x_total 3.0\n"
        '# HELP fd:h Hist\n# TYPE fd:h histogram\nfd:h_bucket{le="1.0"} 2.0\n'
    )
    text = merge_metrics({"http://a:1": page, "http://b:2": page.replace("3.0", "4.0")})
    lines = text.splitlines()
    assert lines.count("# TYPE fd:x counter") == 1 and lines.count("# TYPE fd:h histogram") == 1
    assert 'fd:x_total{instance="http://a:1"} 3.0' in lines
    assert 'fd:x_total{instance="http://b:2"} 4.0' in lines
    assert 'fd:h_bucket{instance="http://b:2",le="1.0"} 2.0' in lines
    # every family's samples follow its own header
    assert lines.index('fd:x_total{instance="http://b:2"} 4.0') < lines.index("# HELP fd:h Hist")


def test_fd_router_on_a_taken_port_is_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = subprocess.run(
            [sys.executable, "-m", "fdcli.main", "router", "--port", str(port)],
            capture_output=True, text=True, cwd=REPO, timeout=60,
        )  # fmt: skip
    assert p.returncode != 0 and p.stderr.count("\n") == 1 and f"127.0.0.1:{port}" in p.stderr, p.stderr
    p = subprocess.run(
        [sys.executable, "-m", "fdcli.main", "router", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and p.stderr.count("\n") == 1


@pytest.mark.parametrize("value", ["-1", "abc", "1.5", ""])
def test_a_bad_max_local_prefill_length_is_one_line(value):
    p = subprocess.run(
        [sys.executable, "-m", "fdcli.main", "router", "--max-local-prefill-length", value],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "--max-local-prefill-length" in p.stderr and "Traceback" not in p.stderr


def test_what_the_router_counts_before_a_local_prefill():
    chat = "/v1/chat/completions"
    # token ids are counted without asking; text is asked of /tokenize unless plainly too long
    assert tokenize_body("/v1/completions", {"prompt": [5, 6, 7]}, 8) == 3
    assert tokenize_body("/v1/completions", {"prompt": [[5, 6]]}, 8) == 2
    assert tokenize_body("/v1/completions", {"model": "m", "prompt": "hi"}, 8) == {
        "model": "m",
        "prompt": "hi",
    }
    # a text whose bytes and the special tokens fit is short without asking (an upper bound)
    fits = 2 + SPECIAL_TOKENS_BOUND
    assert tokenize_body("/v1/completions", {"prompt": "hi"}, fits) == fits
    assert isinstance(tokenize_body("/v1/completions", {"prompt": "h\u00e9"}, fits), dict)  # 3 bytes
    assert tokenize_body("/v1/completions", {"prompt": "x" * (CHARS_PER_TOKEN_BOUND * 8 + 1)}, 8) is None
    # a batch, or a chat with an image, goes through a prefill instance
    assert tokenize_body("/v1/completions", {"prompt": ["a", "b"]}, 8) is None
    image = {"type": "image_url", "image_url": {"url": "data:,"}}
    assert tokenize_body(chat, {"messages": [{"role": "user", "content": [image]}]}, 8) is None
    msgs = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    want = {"messages": msgs, "add_generation_prompt": True, "tools": [{"type": "function"}]}
    assert tokenize_body(chat, {"messages": msgs, "tools": [{"type": "function"}]}, 8) == want
    assert parse_max_local_prefill_length(None) == 0 and parse_max_local_prefill_length("512") == 512


def test_fastdeploys_router_launch_line_runs(monkeypatch):
    # `python -m fastdeploy.router.launch --port 30000 --splitwise` (FastDeploy's docs): its flags are
    # --host, --port, --splitwise and --request-timeout-secs (fastdeploy/router/router.py RouterArgs).
    from typer.testing import CliRunner

    from fdcli.main import app

    calls = []
    monkeypatch.setattr(
        "fdcli_engine.entrypoints.router.launcher.run_router", lambda *a, **kw: calls.append(a) or 0
    )
    argv = ["router", "--port", "30000", "--splitwise", "--request-timeout-secs", "1800"]
    r = CliRunner().invoke(app, argv)
    assert r.exit_code == 0, r.output
    assert calls == [("127.0.0.1", 30000, 0, "")]
    assert "--splitwise has no effect" in r.stderr and "--request-timeout-secs has no effect" in r.stderr
    r = CliRunner().invoke(app, ["router", "--request-timeout-secs", "0"])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "must be positive" in r.stderr


@pytest.mark.parametrize("roles", [("prefill", "decode"), ("mixed",)])
def test_an_instance_that_dies_before_a_non_streamed_answer_is_a_502_error_object(roles):
    # A non-streamed answer's headers come with its end, so a decode (or mixed) instance killed while
    # generating drops the connection before any response: the client gets the documented 502 error
    # object (docs/disaggregation.md), not a bare 500 from the router's own traceback.
    import asyncio
    import json

    import httpx

    from fdcli_engine.entrypoints.router.proxy import PDProxy

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "p":
            return httpx.Response(200, json={"choices": []})
        raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)

    reg = Registry()
    if "prefill" in roles:
        reg.register("prefill", "http://p:1")
    victim = reg.register(roles[-1], "http://d:1", "ipc:///tmp/x.sock" if roles[-1] == "decode" else "")

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
            return await PDProxy(reg, client).handle("/v1/chat/completions", body, {})

    r = asyncio.run(go())
    assert r.status_code == 502 and r.media_type == "application/json"
    error = json.loads(r.body)["error"]
    assert error["message"] == f"the {roles[-1]} instance http://d:1 failed mid-request", error
    assert (error["type"], error["code"]) == ("bad_gateway", "decode_failed")
    assert not reg.is_alive(victim) and victim.in_flight == 0


@pytest.mark.parametrize("roles", [("prefill", "decode"), ("mixed",)])
def test_a_client_that_hangs_up_closes_the_instances_request(roles):
    # fd serve aborts a non-streamed request whose client left; behind the router that client is the
    # router, so it must close its own request to the instance when its client leaves (else the
    # instance generates the whole answer for nobody).
    import asyncio

    import httpx

    from fdcli_engine.entrypoints.router.proxy import PDProxy

    closed = []

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "p":
            return httpx.Response(200, json={"choices": []})
        try:
            await asyncio.sleep(3600)  # an answer still being generated
        except asyncio.CancelledError:
            closed.append(request.url.host)
            raise
        return httpx.Response(200, json={})

    reg = Registry()
    if "prefill" in roles:
        reg.register("prefill", "http://p:1")
    inst = reg.register(roles[-1], "http://d:1", "ipc:///tmp/x.sock" if roles[-1] == "decode" else "")
    polls = []

    async def client_gone() -> bool:
        polls.append(1)
        return len(polls) > 1  # the client leaves after the first look

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
            proxy = PDProxy(reg, client)
            return await asyncio.wait_for(proxy.handle("/v1/chat/completions", body, {}, client_gone), 60)

    r = asyncio.run(go())
    assert r.status_code == 499 and closed == ["d"]
    assert inst.in_flight == 0 and reg.is_alive(inst)  # the instance did nothing wrong
