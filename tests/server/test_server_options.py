"""Server option helpers that need no running server."""

from __future__ import annotations

import socket

import pytest

from fdcli_engine.config import EngineConfig
from fdcli_engine.entrypoints.openai.app_state import Admission, key_matches
from fdcli_engine.entrypoints.openai.launcher import bind_socket
from fdcli_engine.entrypoints.openai.serving_options import default_served_name, load_chat_template
from fdcli_engine.errors import ConfigError


def test_chat_template_from_file_or_inline(tmp_path):
    f = tmp_path / "t.jinja"
    f.write_text("{{ messages[0].content }}")
    assert load_chat_template(str(f)) == "{{ messages[0].content }}"
    assert load_chat_template("{% for m in messages %}{% endfor %}") == "{% for m in messages %}{% endfor %}"
    with pytest.raises(ConfigError, match="neither a file"):
        load_chat_template(str(tmp_path / "missing.jinja"))


def test_default_served_name():
    assert (
        default_served_name(EngineConfig(model="/m/SmolLM2-135M-Instruct.Q4_1.gguf"))
        == "SmolLM2-135M-Instruct.Q4_1"
    )
    assert default_served_name(EngineConfig(model="models/qwen3")) == "models/qwen3"


def test_port_in_use():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(ConfigError, match="already in use"):
            bind_socket("127.0.0.1", s.getsockname()[1])


def test_key_matching():
    assert key_matches("b", ["a", "b"]) and not key_matches("c", ["a", "b"]) and not key_matches("", ["a"])


def test_admission_limits_and_waits():
    import asyncio

    from fdcli_engine.entrypoints.openai.errors import APIError

    async def scenario():
        adm = Admission(limit=1, max_wait=0.05)
        await adm.acquire()
        with pytest.raises(APIError) as e:
            await adm.acquire()  # full: waits 50 ms, then 429
        assert e.value.status == 429 and e.value.headers["Retry-After"] == "1"
        waiter = asyncio.create_task(Admission.acquire(adm))
        await asyncio.sleep(0.01)
        adm.release()  # frees the slot within the waiter's window
        await asyncio.wait_for(waiter, 1)
        assert adm.inflight == 1 and not adm.idle.is_set()
        adm.release()
        assert adm.idle.is_set()

    asyncio.run(scenario())


def test_queue_size_limit():
    import asyncio

    from fdcli_engine.entrypoints.openai.errors import APIError

    async def scenario():
        adm = Admission(limit=1, max_wait=-1, max_queue=1)
        await adm.acquire()
        queued = asyncio.create_task(adm.acquire())  # waits (no time limit), fills the queue
        await asyncio.sleep(0.01)
        with pytest.raises(APIError) as e:
            await adm.acquire()  # the queue is full: 429 at once
        assert e.value.status == 429 and "1 queued" in e.value.message
        adm.release()
        await asyncio.wait_for(queued, 1)
        assert adm.waiting == 0 and adm.inflight == 1

    asyncio.run(scenario())


@pytest.mark.parametrize("max_wait", [-1, 30.0])
def test_draining_answers_queued_requests_503(max_wait):
    """#28 item 8: requests waiting for admission when the drain starts get 503 at once (not 429 after
    their wait runs out); a slot freed afterwards is not taken by them."""
    import asyncio

    from fdcli_engine.entrypoints.openai.errors import APIError

    async def scenario():
        adm = Admission(limit=1, max_wait=max_wait)
        await adm.acquire()
        queued = [asyncio.create_task(adm.acquire()) for _ in range(3)]
        await asyncio.sleep(0.01)
        assert adm.waiting == 3
        adm.close()
        results = await asyncio.wait_for(asyncio.gather(*queued, return_exceptions=True), 1)
        assert [(type(r), r.status) for r in results] == [(APIError, 503)] * 3
        assert adm.waiting == 0 and adm.inflight == 1
        adm.release()
        assert adm.idle.is_set()
        with pytest.raises(APIError) as e:
            await adm.acquire()  # closed: no new slots either
        assert e.value.status == 503
        assert adm.inflight == 0 and not adm._sem.locked()  # no slot leaked

    asyncio.run(scenario())
