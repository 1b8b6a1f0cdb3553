"""`fd complete` against a real `fd serve` (the shared tiny random model server of tests/conftest.py),
through Typer's runner."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from fdcli.main import app

runner = CliRunner()


def _reference(server, prompt: str, max_tokens=8) -> str:
    with server.http() as h:
        body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        return h.post("/v1/completions", json=body).json()["choices"][0]["text"]


def _args(server, *extra):
    return [
        "complete",
        "--url",
        f"{server.url}/v1",
        "--api-key",
        server.api_key,
        "--temperature",
        "0",
        "--max-tokens",
        "8",
        *extra,
    ]


def test_prompt_argument_streams_the_completion(server):
    r = runner.invoke(app, _args(server, "the quick brown fox"))
    assert r.exit_code == 0, r.output
    assert r.stdout == _reference(server, "the quick brown fox") + "\n"


def test_url_without_path_means_its_v1(server):
    """`--url host:port` (no scheme, no path) reaches the server's /v1 API; it answered 404 before."""
    args = _args(server, "the quick brown fox")
    args[2] = server.url.partition("://")[2]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert r.stdout == _reference(server, "the quick brown fox") + "\n"


def test_prompt_from_stdin(server):
    r = runner.invoke(app, _args(server), input="hello world")
    assert r.exit_code == 0, r.output
    assert r.stdout == _reference(server, "hello world") + "\n"


def test_quick_option_sends_one_prompt(server):
    """vLLM's `vllm complete -q PROMPT` (and --quick): that prompt's completion, then exit."""
    for flag in ("-q", "--quick"):
        r = runner.invoke(app, _args(server, flag, "the quick brown fox"), input="never read\n")
        assert r.exit_code == 0, r.output
        assert r.stdout == _reference(server, "the quick brown fox") + "\n"


def test_each_stdin_line_is_one_prompt(server):
    """As vLLM's complete loop: one completion per line read, blank lines skipped, until EOF."""
    r = runner.invoke(app, _args(server), input="hello world\n\n  \nthe quick brown fox\n")
    assert r.exit_code == 0, r.output
    expected = [_reference(server, "hello world"), _reference(server, "the quick brown fox")]
    assert r.stdout == "".join(f"{text}\n" for text in expected)
    r = runner.invoke(app, _args(server, "-"), input="hello world")  # '-' reads stdin as well
    assert r.exit_code == 0 and r.stdout == _reference(server, "hello world") + "\n"


def test_prompt_given_twice_is_a_usage_error(server):
    r = runner.invoke(app, _args(server, "-q", "a", "b"))
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "-q/--quick" in r.stderr
    r = runner.invoke(app, _args(server, "-q", ""))
    assert r.exit_code == 2 and "the prompt is empty" in r.stderr


def test_json_output(server):
    r = runner.invoke(app, _args(server, "--json", "hello world"))
    assert r.exit_code == 0, r.output
    body = json.loads(r.stdout)
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == _reference(server, "hello world")
    assert body["usage"]["completion_tokens"] <= 8


def test_bad_max_tokens_is_a_usage_error(server):
    r = runner.invoke(app, _args(server, "--max-tokens", "0", "x"))
    assert r.exit_code == 2


def test_server_side_400_is_one_line(server):
    r = runner.invoke(app, _args(server, "--max-tokens", "100000", "hello"))
    assert r.exit_code == 1
    assert r.stderr.count("\n") == 1 and "400" in r.stderr and "max_tokens" in r.stderr


def test_server_down_is_one_line():
    r = runner.invoke(app, ["complete", "hi", "--url", "http://127.0.0.1:9/v1"])
    assert r.exit_code == 1
    assert r.stderr.count("\n") == 1 and "cannot reach the server" in r.stderr


def test_url_without_a_scheme_is_http_as_in_curl(server):
    """`--url localhost:PORT/v1` reaches the server (curl's rule), in fd complete and fd chat alike."""
    address = server.url.removeprefix("http://") + "/v1"
    r = runner.invoke(
        app, [*_args(server, "the quick brown fox")[:2], address, *_args(server)[3:], "the quick brown fox"]
    )
    assert r.exit_code == 0, r.output
    assert r.stdout == _reference(server, "the quick brown fox") + "\n"
    chat = ["chat", "--url", address, "--api-key", server.api_key, "-q", "hi", "--max-tokens", "2"]
    r = runner.invoke(app, chat)
    assert r.exit_code == 0, r.output


def test_url_with_another_scheme_is_one_line():
    for command in (["complete", "hi"], ["chat", "-q", "hi"]):
        r = runner.invoke(app, [*command, "--url", "ftp://127.0.0.1:9/v1"])
        assert r.exit_code == 2
        assert r.stderr.count("\n") == 1 and "--url 'ftp://127.0.0.1:9/v1': use an http://" in r.stderr


def test_unreachable_address_without_a_scheme_names_it_whole():
    r = runner.invoke(app, ["complete", "hi", "--url", "127.0.0.1:9/v1"])
    assert r.exit_code == 1 and r.stderr.count("\n") == 1
    assert "http://127.0.0.1:9/v1/models" in r.stderr and "missing" not in r.stderr
