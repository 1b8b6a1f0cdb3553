"""Conditional disaggregation end to end: `fd router --max-local-prefill-length` in front of real
prefill and decode `fd serve` processes of the tiny model (one thread each), the openai SDK as client.

Oracle: the session's mixed `fd serve` of the same checkpoint gives the same greedy answers; which
instance computed a prompt is read from the instances' /metrics: the prefill instance's prompt-token
and sent-transfer counters move only for a prompt above the threshold, the decode instance's loaded
blocks only then, and the router's local-prefill counter only for a prompt at or below it. Prompts of
token ids put the boundary at an exact count (LIMIT tokens: local; LIMIT + 1: disaggregated).
"""

from __future__ import annotations

import httpx
import pytest
from fd_server import API_KEY
from pd_deploy import Deployment, one_prefill_one_decode

LIMIT = 24
SHORT = {False: "a short one", True: "a short two"}
LONG = "the quick brown fox jumps over the lazy dog " * 6
CHAT_SHORT = [{"role": "user", "content": "hi there"}]


@pytest.fixture(scope="module")
def deploy(tiny_model, tmp_path_factory):
    with one_prefill_one_decode(
        tiny_model, tmp_path_factory.mktemp("pd-local"), "--max-local-prefill-length", str(LIMIT)
    ) as dep:
        yield dep


def counters(dep: Deployment) -> dict[str, float]:
    p, d = dep.instances["p1"].metrics(), dep.instances["d1"].metrics()
    router = httpx.get(
        f"{dep.router.url}/metrics", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=20
    )
    local = [ln for ln in router.text.splitlines() if ln.startswith("fd:router_local_prefill_total ")]
    assert len(local) == 1, router.text
    return {
        "p_prompt": p.get("fd:prompt_tokens_total", 0.0),
        "p_sent": p.get("fd:kv_transfer_sent_total", 0.0),
        "d_prompt": d.get("fd:prompt_tokens_total", 0.0),
        "d_loaded": d.get("fd:kv_transfer_loaded_blocks_total", 0.0),
        "local": float(local[0].split()[1]),
    }


def count(server, **req) -> int:
    r = httpx.post(
        f"{server.url}/tokenize", json={"model": "tiny", **req}, headers=server.headers, timeout=20
    )
    assert r.status_code == 200, r.text
    return r.json()["count"]


def complete(client, prompt, stream: bool = False) -> str:
    kw = dict(model="tiny", prompt=prompt, max_tokens=10, temperature=0)
    if stream:
        return "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw) if c.choices)
    return client.completions.create(**kw).choices[0].text


def chat(client, messages) -> str:
    out = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0)
    return out.choices[0].message.content


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_short_prompts_are_prefilled_by_the_decode_instance_alone(deploy, server, stream):
    prompt = SHORT[stream]
    assert count(server, prompt=prompt) <= LIMIT and count(server, messages=CHAT_SHORT) <= LIMIT
    want = (complete(server.client(), prompt), chat(server.client(), CHAT_SHORT))
    before = counters(deploy)
    c = deploy.router.client()
    assert (complete(c, prompt, stream), chat(c, CHAT_SHORT)) == want
    after = counters(deploy)
    assert after["p_prompt"] == before["p_prompt"] and after["p_sent"] == before["p_sent"]
    assert after["d_loaded"] == before["d_loaded"]
    assert after["d_prompt"] > before["d_prompt"] and after["local"] == before["local"] + 2


def test_a_long_prompt_still_goes_through_the_prefill_instance(deploy, server):
    n = count(server, prompt=LONG)
    assert n > LIMIT
    want = complete(server.client(), LONG)
    before = counters(deploy)
    assert complete(deploy.router.client(), LONG) == want
    after = counters(deploy)
    assert after["p_prompt"] == before["p_prompt"] + n and after["p_sent"] == before["p_sent"] + 1
    assert after["d_loaded"] > before["d_loaded"] and after["local"] == before["local"]


def test_the_threshold_is_inclusive_at_an_exact_token_count(deploy, server):
    ids = [(7 * i) % 90 + 5 for i in range(LIMIT + 1)]
    c = deploy.router.client()
    for prompt, local in ((ids[:LIMIT], True), (ids, False)):
        want = server.client().completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0)
        before = counters(deploy)
        got = c.completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0)
        assert got.choices[0].text == want.choices[0].text
        after = counters(deploy)
        assert after["local"] == before["local"] + (1 if local else 0)
        assert after["p_prompt"] == before["p_prompt"] + (0 if local else len(prompt))
