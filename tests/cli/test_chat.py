"""`fd chat` against a real `fd serve` (the shared tiny random model server of tests/conftest.py),
through Typer's runner."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from fdcli.main import app

runner = CliRunner()


def _reference(server, messages, max_tokens=6) -> str:
    with server.http() as h:
        body = {"model": "tiny", "messages": messages, "max_tokens": max_tokens, "temperature": 0}
        return h.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]


def _args(server, *extra):
    return [
        "chat",
        "--url",
        f"{server.url}/v1",
        "--api-key",
        server.api_key,
        "--temperature",
        "0",
        "--max-tokens",
        "6",
        *extra,
    ]


def test_quick_prints_the_streamed_answer(server):
    r = runner.invoke(app, _args(server, "-q", "hello world", "--system-prompt", "be brief"))
    assert r.exit_code == 0, r.output
    want = _reference(
        server, [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"}]
    )
    assert r.stdout == want + "\n"


def test_api_key_from_environment(server):
    args = [a for a in _args(server, "-q", "hi") if a not in ("--api-key", server.api_key)]
    r = runner.invoke(app, args, env={"OPENAI_API_KEY": server.api_key})
    assert r.exit_code == 0, r.output
    assert runner.invoke(app, args, env={"OPENAI_API_KEY": "wrong"}).exit_code == 1


def test_conversation_save_and_reset(server, tmp_path):
    saved, after_reset = tmp_path / "conv.json", tmp_path / "reset.json"
    script = f"hello\n/save {saved}\n/reset\n/save {after_reset}\n/exit\n"
    r = runner.invoke(app, _args(server), input=script)
    assert r.exit_code == 0, r.output
    conv = json.loads(saved.read_text())
    assert conv == [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": _reference(server, [{"role": "user", "content": "hello"}])},
    ]
    assert json.loads(after_reset.read_text()) == []


def test_second_turn_sends_the_history(server, tmp_path):
    saved = tmp_path / "two.json"
    r = runner.invoke(app, _args(server), input=f"hello\nagain\n/save {saved}\n/exit\n")
    assert r.exit_code == 0, r.output
    conv = json.loads(saved.read_text())
    assert [m["role"] for m in conv] == ["user", "assistant", "user", "assistant"]
    assert conv[3]["content"] == _reference(server, conv[:3])


def test_server_down_is_one_line():
    r = runner.invoke(app, ["chat", "-q", "hi", "--url", "http://127.0.0.1:9/v1"])
    assert r.exit_code == 1
    assert r.stderr.count("\n") == 1 and "cannot reach the server" in r.stderr


def test_unknown_model_is_one_line(server):
    r = runner.invoke(app, _args(server, "-q", "hi", "--model-name", "nope"))
    assert r.exit_code == 1
    assert r.stderr.count("\n") == 1 and "404" in r.stderr and "nope" in r.stderr


def test_reasoning_is_shown_apart_from_the_answer(capsys):
    from fdcli.commands.chat import _stream_reply

    class Scripted:
        def stream(self, path, body):
            assert path == "/chat/completions"
            for delta in (
                {"role": "assistant", "content": ""},
                {"reasoning_content": "think "},
                {"reasoning_content": "more"},
                {"content": "The answer"},
                {"content": " is 42"},
            ):
                yield {"choices": [{"index": 0, "delta": delta}]}

    answer = _stream_reply(Scripted(), {})
    assert answer == "The answer is 42"  # the conversation keeps the answer only
    assert capsys.readouterr().out == "[reasoning] think more\n[answer] The answer is 42\n"


def test_ctrl_c_mid_answer_against_the_server_keeps_the_session(server):
    import signal

    from fdcli.commands.chat import run_session
    from fdcli.commands.complete import ApiClient

    client = ApiClient(f"{server.url}/v1", server.api_key)
    real_stream, calls = client.stream, []

    def stream(path, body):  # a Ctrl-C arrives after the first answer text of the first turn
        calls.append(body)
        seen_text = False
        for event in real_stream(path, body):
            if seen_text and len(calls) == 1:
                signal.raise_signal(signal.SIGINT)
            seen_text = seen_text or any((c.get("delta") or {}).get("content") for c in event["choices"])
            yield event

    client.stream = stream
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    messages: list[dict] = []
    try:
        read = iter(["hello", "again", "/exit"])
        # 64 tokens: long enough that the first streamed text cannot already hold the whole answer (a
        # reader that falls behind gets merged deltas, so a short answer could arrive in one event).
        run_session(client, "tiny", messages, {"max_tokens": 64, "temperature": 0}, lambda _: next(read))
    finally:
        signal.signal(signal.SIGINT, previous)
    full = _reference(server, [{"role": "user", "content": "hello"}], max_tokens=64)
    partial = messages[1]["content"]
    assert messages[1]["role"] == "assistant" and partial and full.startswith(partial) and partial != full
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[3]["content"] == _reference(server, messages[:3], max_tokens=64)  # the session went on
