"""`fd chat`'s session loop driven programmatically: a real Ctrl-C (SIGINT to this process) while an
answer streams stops that answer only and keeps the session and the conversation (the partial answer
as the assistant turn); Ctrl-C or Ctrl-D at the prompt ends the session; /help lists the commands."""

from __future__ import annotations

import signal

import pytest

from fdcli.commands.chat import COMMANDS, run_session


class ScriptedClient:
    """Each call to stream() plays the next script: strings are content deltas, "^C" is a Ctrl-C."""

    def __init__(self, *scripts):
        self.scripts = list(scripts)
        self.bodies: list[dict] = []
        self.closed: list[bool] = []

    def stream(self, path, body):
        assert path == "/chat/completions"
        self.bodies.append(body)
        script = self.scripts.pop(0)
        self.closed.append(False)
        try:
            yield {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
            for piece in script:
                if piece == "^C":
                    signal.raise_signal(signal.SIGINT)  # Python's handler: KeyboardInterrupt right here
                yield {"choices": [{"index": 0, "delta": {"content": piece}}]}
        finally:
            self.closed[-1] = True  # the HTTP response would be closed here


def lines(*items):
    it = iter(items)

    def read(prompt):
        item = next(it)
        if isinstance(item, type) and issubclass(item, BaseException):
            raise item
        return item

    return read


@pytest.fixture(autouse=True)
def default_sigint():
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_mid_answer_keeps_the_partial_answer_and_the_session(capsys):
    client = ScriptedClient(["Hel", "lo", "^C", " never"], ["Sure, ", "go on."])
    messages = [{"role": "system", "content": "be brief"}]
    run_session(client, "m", messages, {"max_tokens": 5}, lines("hi", "continue", "/exit"))
    assert messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "continue"},
        {"role": "assistant", "content": "Sure, go on."},
    ]
    assert client.closed == [True, True]  # the stopped stream was closed, not left open
    assert client.bodies[1]["messages"] == messages[:4] and client.bodies[1]["max_tokens"] == 5
    out = capsys.readouterr()
    assert out.out == "Hello\nSure, go on.\n" and "(answer interrupted)" in out.err


def test_ctrl_c_before_any_text_drops_the_unanswered_turn(capsys):
    client = ScriptedClient(["^C", "x"], ["ok"])
    messages: list[dict] = []
    run_session(client, "m", messages, {}, lines("first", "second", EOFError))
    assert messages == [{"role": "user", "content": "second"}, {"role": "assistant", "content": "ok"}]
    assert client.bodies[1]["messages"] == [{"role": "user", "content": "second"}]


@pytest.mark.parametrize("key", [EOFError, KeyboardInterrupt])  # Ctrl-D, Ctrl-C at the prompt
def test_ctrl_c_or_ctrl_d_at_the_prompt_ends_the_session(key):
    client = ScriptedClient(["a"])
    messages: list[dict] = []
    run_session(client, "m", messages, {}, lines("q", key, "never read"))  # returns, raises nothing
    assert messages == [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]


def test_help_lists_the_commands_and_unknown_ones_point_to_it(capsys):
    run_session(ScriptedClient(), "m", [], {}, lines("/help", "/nope", "/quit"))
    err = capsys.readouterr().err
    for usage, what in COMMANDS:
        assert usage in err and what in err
    assert "unknown command /nope" in err and "/help" in err.split("unknown command /nope")[1]
