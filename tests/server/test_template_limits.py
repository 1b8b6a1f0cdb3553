"""Chat-template rendering is bounded (#28 item 1): a hostile template — a request's own with
--trust-request-chat-template, or a model's — is stopped by a wall-clock limit, an output cap or a
check on one oversized value, answered with a 400 naming chat_template, and rendered off the event
loop, so a normal stream finishes and /health answers meanwhile."""

from __future__ import annotations

import threading

import httpx
import pytest
from fd_server import start_server

from fdcli_engine.tokenizer import chat_template as ct

MSGS = [{"role": "user", "content": "hi"}]
LOOP_3000 = "{% for i in range(3000) %}{% for j in range(3000) %}x{% endfor %}{% endfor %}"
BIG_STRING = "{{ 'x' * 20000000 }}"
LOOP_1E5 = "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"
SILENT_LOOP = "{% set r = range(100000)|list %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}"


@pytest.fixture
def short_limit(monkeypatch):
    monkeypatch.setattr(ct, "RENDER_TIMEOUT_S", 0.3)


@pytest.mark.parametrize(
    "template", [LOOP_3000, LOOP_1E5, SILENT_LOOP], ids=["3000x3000", "1e5x1e5", "silent"]
)
def test_long_loops_stop_at_the_time_limit(short_limit, template):
    with pytest.raises(ct.RenderLimitError, match=r"ran for more than 0.3 s") as e:
        ct.render_chat_template(template, MSGS)
    assert e.value.param == "chat_template"


def test_output_is_capped(monkeypatch):
    monkeypatch.setattr(ct, "MAX_RENDER_CHARS", 1000)
    with pytest.raises(ct.RenderLimitError, match="wrote more than 1000 characters"):
        ct.render_chat_template("{% for i in range(2000) %}x{% endfor %}", MSGS)
    assert ct.render_chat_template("{% for i in range(1000) %}x{% endfor %}", MSGS) == "x" * 1000


@pytest.mark.parametrize(
    "template, what",
    [
        (BIG_STRING, "with '\\*'"),
        ("{{ [0] * 100000000 }}", "with '\\*'"),
        ("{{ 100000000 * 'ab' }}", "with '\\*'"),
        ("{{ 2 ** 100000000 }}", "with '\\*\\*'"),
        ("{{ '%999999999d' % 1 }}", "wider than"),
        ("{{ '%.999999999f' % 1.5 }}", "wider than"),
    ],
)
def test_one_oversized_value_is_refused_before_it_is_built(template, what):
    with pytest.raises(ct.RenderLimitError, match=what):
        ct.render_chat_template(template, MSGS)


def test_ordinary_arithmetic_and_formatting_still_work():
    out = ct.render_chat_template(
        "{{ 3 * 4 }} {{ 2 ** 10 }} {{ '%5d|%.2f' % (3, 1.5) }} {{ 'ab' * 3 }}", MSGS
    )
    assert out == "12 1024     3|1.50 ababab"


def test_limits_leave_the_callers_trace_function_in_place():
    import sys

    calls = []

    def tracer(frame, event, arg):
        calls.append(event)

    sys.settrace(tracer)
    try:
        ct.render_chat_template("{{ messages[0].content }}", MSGS)
        after = sys.gettrace()
    finally:
        sys.settrace(None)
    assert after is tracer


def test_hostile_requests_do_not_stall_the_server(tiny_model, tmp_path):
    """#28's hostile cases together, against one server, while a normal stream runs: each is a 400
    naming its field, the stream finishes, and /health answers throughout."""
    srv = start_server(tiny_model, tmp_path, "--served-model-name", "tiny", "--trust-request-chat-template")
    try:
        http = srv.http()
        stream_text: list[str] = []

        def stream():
            body = {"model": "tiny", "prompt": "hello", "max_tokens": 200, "ignore_eos": True, "stream": True}
            with http.stream("POST", "/v1/completions", json=body) as r:
                stream_text.extend(r.iter_text())

        def chat(**kw):
            return ("/v1/chat/completions", {"model": "tiny", "messages": MSGS, **kw})

        attacks = {  # name -> (route, body, the param the 400 names)
            "template-loop": (*chat(chat_template=LOOP_3000), "chat_template"),
            "template-string": (*chat(chat_template=BIG_STRING), "chat_template"),
            "template-silent": (*chat(chat_template=SILENT_LOOP), "chat_template"),
            "million-prompts": ("/v1/completions", {"model": "tiny", "prompt": [""] * 10**6}, "prompt"),
            # 5 MB of text to tokenize: past the tiny model's context once counted.
            "five-mb-chat": (
                *chat(messages=[{"role": "user", "content": "word " * 200_000}] * 5),
                "messages",
            ),
        }
        results: dict[str, httpx.Response] = {}

        def hostile(name, path, body):
            results[name] = srv.http().post(path, json=body)

        threads = [
            threading.Thread(target=hostile, args=(name, path, body))
            for name, (path, body, _) in attacks.items()
        ]
        for a in threads:
            a.start()
        t = threading.Thread(target=stream)  # a normal stream while the attacks run
        t.start()
        health = []
        while any(a.is_alive() for a in threads):
            # Work on the event loop would hold it for seconds; this bound is far above a free loop's.
            health.append(httpx.get(f"{srv.url}/health", timeout=1.0).status_code)
        for a in threads:
            a.join()
        t.join(120)
        assert health and set(health) == {200}
        for name, (_, _, param) in attacks.items():
            r = results[name]
            assert r.status_code == 400, (name, r.text[:300])
            assert r.json()["error"]["param"] == param, (name, r.text[:300])
        text = "".join(stream_text)
        assert '"finish_reason":"length"' in text and text.rstrip().endswith("data: [DONE]")
    finally:
        assert srv.stop() == 0
