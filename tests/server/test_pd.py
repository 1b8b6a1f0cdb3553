"""Prefill/decode disaggregation end to end: `fd router` in front of real `fd serve --splitwise-role`
processes of the tiny model (one thread each, 127.0.0.1), the official openai SDK as the client.

Oracle: the session's mixed `fd serve` of the same checkpoint: greedy outputs through 1P1D and 2P1D
are identical to it, streamed and not, and the decode instances did load transferred blocks. Faults: a
decode instance killed mid-stream ends that stream with an error within seconds and another decode
instance serves the next request; a prefill instance killed with a request inside hands it to the
other; with every prefill instance gone the router answers 503.

The module's tests share one deployment and run in file order (later ones add and kill instances).
"""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import threading
import time

import httpx
import openai
import psutil
import pytest
from fd_server import API_KEY, REPO, wait_for
from pd_deploy import Deployment, one_prefill_one_decode

PROMPTS = ["hello world " * 8, "the quick brown fox jumps over the lazy dog " * 3, "a b c d e f g " * 6]
CHAT = [{"role": "user", "content": "tell me a story about " + "a small red bird " * 4}]


@pytest.fixture(scope="module")
def deploy(tiny_model, tmp_path_factory):
    with one_prefill_one_decode(tiny_model, tmp_path_factory.mktemp("pd")) as dep:
        yield dep


def completions(client, stream: bool) -> list[str]:
    out = []
    for prompt in PROMPTS:  # the streamed pass asks other prompts: no prefix-cache hit on the decode side
        kw = dict(model="tiny", prompt=("streamed " if stream else "") + prompt, max_tokens=12, temperature=0)
        if stream:
            out.append(
                "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw) if c.choices)
            )
        else:
            out.append(client.completions.create(**kw).choices[0].text)
    return out


def chats(client, stream: bool) -> str:
    messages = [{"role": "user", "content": ("streamed " if stream else "") + CHAT[0]["content"]}]
    kw = dict(model="tiny", messages=messages, max_tokens=12, temperature=0)
    if stream:
        parts = client.chat.completions.create(stream=True, **kw)
        return "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
    return client.chat.completions.create(**kw).choices[0].message.content


def loaded_blocks(dep: Deployment) -> float:
    total = 0.0
    for name, srv in dep.instances.items():
        if name.startswith("d"):
            total += srv.metrics().get("fd:kv_transfer_loaded_blocks_total", 0.0)
    return total


@pytest.fixture(scope="module")
def mixed_answers(server):
    c = server.client()
    return {s: (completions(c, s), chats(c, s)) for s in (False, True)}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_1p1d_answers_like_mixed(deploy, mixed_answers, stream):
    before = loaded_blocks(deploy)
    c = deploy.router.client()
    assert (completions(c, stream), chats(c, stream)) == mixed_answers[stream]
    assert loaded_blocks(deploy) > before  # the decode instance used the prefill instance's blocks


def test_2p1d_spreads_prefills_and_answers_like_mixed(deploy, mixed_answers):
    deploy.add("p2", "prefill")
    c = deploy.router.client()
    want = mixed_answers[False][0]
    sent = {n: deploy.instances[n].metrics().get("fd:kv_transfer_sent_total", 0) for n in ("p1", "p2")}
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        got = list(pool.map(lambda i: completions(c, False)[i % 3], range(12)))
    assert got == [want[i % 3] for i in range(12)]
    after = {n: deploy.instances[n].metrics().get("fd:kv_transfer_sent_total", 0) for n in ("p1", "p2")}
    assert sum(after.values()) - sum(sent.values()) == 36
    assert all(after[n] > sent[n] for n in after)  # both prefill instances took requests


def test_router_health_metrics_and_models_cover_every_instance(deploy):
    r = httpx.get(f"{deploy.router.url}/health", timeout=20)
    assert r.status_code == 200 and r.json()["status"] == "ok"
    assert {i["url"] for i in r.json()["instances"]} == {s.url for s in deploy.instances.values()}
    text = httpx.get(f"{deploy.router.url}/metrics", headers={"Authorization": f"Bearer {API_KEY}"}).text
    for srv in deploy.instances.values():
        assert f'fd:num_requests_running{{instance="{srv.url}"}}' in text
    assert text.count("# TYPE fd:num_requests_running ") == 1
    assert [m.id for m in deploy.router.client().models.list()] == ["tiny"]


def test_a_role_the_instance_lacks_is_a_400_naming_the_field(deploy):
    p = deploy.instances["p1"].client()
    with pytest.raises(openai.BadRequestError) as e:
        p.completions.create(
            model="tiny", prompt="hi", max_tokens=2,
            extra_body={"kv_transfer_params": {"do_remote_prefill": True, "transfer_id": "x"}},
        )  # fmt: skip
    assert e.value.body["param"] == "kv_transfer_params"


def busy(dep: Deployment, role: str) -> str:
    """The name of the instance of `role` the router has a request in flight with."""
    urls = {i["url"] for i in dep.router.instances() if i["role"] == role and i["in_flight"] > 0}
    names = [n for n, s in dep.instances.items() if s.url in urls]
    return names[0] if names else ""


def test_decode_killed_mid_stream_errors_fast_and_another_decode_serves(deploy, mixed_answers):
    deploy.add("d2", "decode")
    cores = {n: s.core_process() for n, s in deploy.instances.items() if n.startswith("d")}
    c = deploy.router.client(timeout=30)
    stream = c.completions.create(
        model="tiny", prompt="hello", max_tokens=230, temperature=0, stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    chunks = iter(stream)
    next(chunks)
    for core in cores.values():  # at once: the stream cannot end before the kill
        core.suspend()
    victim = wait_for(lambda: busy(deploy, "decode"), 10, "the decode instance serving the stream")
    for name, core in cores.items():
        if name != victim:
            core.resume()
    t0 = time.monotonic()
    deploy.kill(victim)
    received, error = 1, None
    try:
        for _ in chunks:
            received += 1
    except openai.APIError as e:
        error = e
    assert error is not None, f"the stream ended after {received} chunks without an error"
    assert time.monotonic() - t0 < 10 and received < 230
    assert completions(c, False) == mixed_answers[False][0]  # the other decode instance


def test_prefill_killed_with_a_request_inside_hands_it_to_the_other(deploy, mixed_answers):
    p_names = [n for n in deploy.instances if n.startswith("p")]
    assert len(p_names) == 2
    # Their engine cores stop (the front ends still heartbeat): neither answers until one instance is
    # killed and the other's core resumes.
    cores = {n: deploy.instances[n].core_process() for n in p_names}
    for core in cores.values():
        core.suspend()
    result: list = []
    c = deploy.router.client(timeout=60)
    t = threading.Thread(
        target=lambda: result.append(
            c.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=12, temperature=0)
            .choices[0]
            .text
        ),
        daemon=True,
    )
    try:
        t.start()
        victim = wait_for(lambda: busy(deploy, "prefill"), 10, "the prefill instance holding the request")
        survivor = next(n for n in p_names if n != victim)
        cores[survivor].resume()
        deploy.kill(victim)
    finally:
        for core in cores.values():
            try:
                core.resume()
            except psutil.NoSuchProcess:
                pass
    t.join(60)
    assert result == [mixed_answers[False][0][0]]


def test_no_prefill_instance_is_a_503(deploy):
    for name in [n for n in deploy.instances if n.startswith("p")]:
        deploy.kill(name)
    wait_for(lambda: not any(i["role"] == "prefill" for i in deploy.router.instances()), 10, "P forgotten")
    with pytest.raises(openai.APIStatusError) as e:
        deploy.router.client().completions.create(model="tiny", prompt="hi", max_tokens=2)
    assert e.value.status_code == 503 and "prefill" in e.value.message
    assert httpx.get(f"{deploy.router.url}/health", timeout=20).status_code == 503


def test_without_a_pair_a_registered_mixed_instance_serves(deploy, server, mixed_answers):
    assert not any(i["role"] == "prefill" for i in deploy.router.instances())
    r = httpx.post(f"{deploy.router.url}/register", json={"role": "mixed", "url": server.url}, timeout=10)
    assert r.status_code == 200  # one registration: the instance is listed for 3 s
    out = deploy.router.client().completions.create(
        model="tiny", prompt=PROMPTS[0], max_tokens=12, temperature=0
    )
    assert out.choices[0].text == mixed_answers[False][0][0]


def test_a_transfer_socket_beyond_loopback_without_a_token_refuses_to_start():
    env = {k: v for k, v in os.environ.items() if k != "FD_KV_TRANSFER_TOKEN"}
    cmd = [
        sys.executable, "-m", "fdcli.main", "serve", "--splitwise-role", "decode", "--router", "127.0.0.1:9",
        "--cache-transfer-protocol", "tcp", "--kv-transfer-host", "0.0.0.0",
    ]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=60)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "--kv-transfer-token" in p.stderr, p.stderr
