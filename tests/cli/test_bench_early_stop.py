"""`fd bench serve` warns when most replies stop after one token: the sharegpt-on-completions case
(chat turns sent as raw text; an instruct model ends its turn at once), against a scripted server
that answers the way SmolLM2-Instruct does there (one special token, no text, finish_reason stop)."""

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.append(str(Path(__file__).resolve().parents[1] / "bench"))  # for bench_support

from bench_support import running_server  # noqa: E402

from fdcli.commands.bench import app  # noqa: E402

runner = CliRunner()


@pytest.fixture
def scripted_server():
    with running_server() as state:
        yield state


def _sharegpt(tmp_path, first_word: str) -> str:
    convs = [
        {"conversations": [{"from": "human", "value": f"{first_word} question {i}?"},
                           {"from": "gpt", "value": "a long recorded answer"}]}
        for i in range(4)
    ]  # fmt: skip
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(convs))
    return str(path)


def _run(server, tmp_path, first_word, *extra):
    args = ["serve", "--base-url", server.url, "--dataset", "sharegpt",
            "--dataset-path", _sharegpt(tmp_path, first_word), "--sharegpt-output-len", "8",
            "--num-prompts", "4", "--num-warmups", "0", "--no-progress", "--no-chart", *extra]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    return res


def test_one_token_replies_on_completions_warn_and_name_the_fix(scripted_server, tmp_path):
    res = _run(scripted_server, tmp_path, "eos")
    assert "4 of 4 replies ended after at most 1 token" in res.stderr
    assert "--backend openai-chat" in res.stderr and "--ignore-eos" in res.stderr
    assert all("prompt" in p and "messages" not in p for p in scripted_server.payloads)


def test_chat_backend_warning_suggests_ignore_eos_only(scripted_server, tmp_path):
    res = _run(scripted_server, tmp_path, "eos", "--backend", "openai-chat")
    assert "replies ended after at most 1 token" in res.stderr
    assert "--ignore-eos" in res.stderr and "--backend openai-chat" not in res.stderr


@pytest.mark.parametrize("first_word, extra", [("ok", []), ("eos", ["--ignore-eos"])])
def test_no_warning_for_full_replies_or_with_ignore_eos(scripted_server, tmp_path, first_word, extra):
    res = _run(scripted_server, tmp_path, first_word, *extra)
    assert "replies ended after" not in res.stderr
