"""`fd serve` option parsing (flags, YAML file, environment) with the server itself patched out."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from fdcli.main import app

runner = CliRunner()


def test_yaml_holds_engine_and_server_options_and_flags_win(captured, tmp_path):
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(
        "port: 9001\nhost: 0.0.0.0\nmax-num-seqs: 8\nmax_model_len: 512\napi-key: from-file\n"
        "reasoning-parser: qwen3\nmax-concurrency: 4\n"
    )
    r = runner.invoke(app, ["serve", "--config", str(cfg), "--port", "9002", "--max-num-seqs", "3"])
    assert r.exit_code == 0, r.output
    ((config, args),) = captured
    assert (args.host, args.port, args.max_concurrency, args.serving.reasoning_parser) == (
        "0.0.0.0",
        9002,
        4,
        "qwen3",
    )
    assert args.api_keys == ["from-file"]
    assert (config.max_num_seqs, config.max_model_len) == (3, 512)


def test_defaults(captured, monkeypatch):
    monkeypatch.delenv("FD_API_KEY", raising=False)
    r = runner.invoke(app, ["serve"])
    assert r.exit_code == 0, r.output
    ((config, args),) = captured
    assert (args.host, args.port, args.api_keys) == ("127.0.0.1", 8000, [])
    assert config.model is None  # the engine resolves the default model (SmolLM2)


def test_api_keys_repeatable_or_from_environment(captured):
    r = runner.invoke(app, ["serve", "--api-key", "a", "--api-key", "b"])
    assert r.exit_code == 0, r.output
    assert captured[-1][1].api_keys == ["a", "b"]
    r = runner.invoke(app, ["serve"], env={"FD_API_KEY": "secret"})
    assert r.exit_code == 0, r.output
    assert captured[-1][1].api_keys == ["secret"]


def test_empty_api_key_means_no_key_as_in_vllm(captured, tmp_path):
    """--api-key "" asks for no key (vLLM's rule), as FD_API_KEY="" does; it is said, never a key no
    client can send (every request would be a 401)."""
    r = runner.invoke(app, ["serve", "--api-key", ""])
    assert r.exit_code == 0, r.output
    assert captured[-1][1].api_keys == []
    assert r.stderr.count("\n") == 1 and "requires no API key" in r.stderr
    r = runner.invoke(app, ["serve"], env={"FD_API_KEY": ""})
    assert r.exit_code == 0 and captured[-1][1].api_keys == [] and r.stderr == ""
    r = runner.invoke(app, ["serve", "--api-key", "", "--api-key", "k"])
    assert captured[-1][1].api_keys == ["k"] and "empty --api-key is skipped" in r.stderr
    cfg = tmp_path / "c.yaml"
    cfg.write_text('api-key: ""\n')
    r = runner.invoke(app, ["serve", "--config", str(cfg)])
    assert r.exit_code == 0 and captured[-1][1].api_keys == [], r.output


def test_api_key_file_adds_its_keys(captured, tmp_path, monkeypatch):
    """#28 item 8: keys from a file never show in `ps`; a key on the command line warns that it does."""
    monkeypatch.delenv("FD_API_KEY", raising=False)
    keys = tmp_path / "keys"
    keys.write_text("# the team's keys\n  k-one  \n\nk-two\n")
    r = runner.invoke(app, ["serve", "--api-key-file", str(keys)])
    assert r.exit_code == 0, r.output
    assert captured[-1][1].api_keys == ["k-one", "k-two"] and "Warning" not in r.stderr
    r = runner.invoke(app, ["serve", "--api-key-file", str(keys)], env={"FD_API_KEY": "env-key"})
    assert captured[-1][1].api_keys == ["env-key", "k-one", "k-two"]
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(f"api-key-file: {keys}\n")
    r = runner.invoke(app, ["serve", "--config", str(cfg)])
    assert r.exit_code == 0 and captured[-1][1].api_keys == ["k-one", "k-two"], r.output


def test_api_key_on_the_command_line_warns(captured, monkeypatch):
    monkeypatch.setattr("sys.argv", ["fd", "serve", "--api-key", "visible"])
    r = runner.invoke(app, ["serve", "--api-key", "visible"])
    assert r.exit_code == 0 and captured[-1][1].api_keys == ["visible"]
    assert "visible to every user" in r.stderr and "--api-key-file" in r.stderr


def test_empty_api_key_on_the_command_line_does_not_warn_of_ps(captured, monkeypatch):
    """`--api-key ""` shows no secret in ps: the one line says the server needs no key."""
    monkeypatch.setattr("sys.argv", ["fd", "serve", "--api-key", ""])
    r = runner.invoke(app, ["serve", "--api-key", ""])
    assert r.exit_code == 0 and captured[-1][1].api_keys == []
    assert "visible to every user" not in r.stderr and r.stderr.count("\n") == 1, r.stderr


@pytest.mark.parametrize("content, needle", [(None, "cannot read"), ("# only a comment\n\n", "holds no key")])
def test_bad_api_key_file_is_one_line(captured, tmp_path, content, needle):
    path = tmp_path / "keys"
    if content is not None:
        path.write_text(content)
    r = runner.invoke(app, ["serve", "--api-key-file", str(path)])
    assert r.exit_code == 2 and not captured
    assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1 and needle in r.stderr, r.stderr


@pytest.mark.parametrize(
    "yaml_text,needle",
    [
        ("max_concurency: 3\n", "max_concurency"),
        ("- just a list\n", "mapping"),
        ("port: [1\n", "YAML"),
        ("port: eighty\n", "--port"),
        ("api-key: [1, 2]\n", "--api-key"),
        ("max-waiting-time: soon\n", "--max-waiting-time"),
    ],
)
def test_bad_config_file_is_one_line(captured, tmp_path, yaml_text, needle):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml_text)
    r = runner.invoke(app, ["serve", "--config", str(cfg)])
    assert r.exit_code == 2
    assert r.stderr.count("\n") == 1 and needle in r.stderr
    assert not captured


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--port", "70000"], "--port"),
        (["--uvicorn-log-level", "loud"], "--uvicorn-log-level"),
        (["--max-concurrency", "0"], "--max-concurrency"),
    ],
)
def test_bad_server_flag_is_a_usage_error(captured, argv, needle):
    r = runner.invoke(app, ["serve", *argv])
    assert r.exit_code == 2 and needle in r.stderr and not captured


# HTTP framing limits (http_guard.py): flags and --config keys reach ServerArgs; non-positive is refused.
def test_framing_limits_from_flags_and_yaml(captured, tmp_path):
    from fdcli_engine.entrypoints.openai.app_state import ServerArgs

    r = runner.invoke(app, ["serve"])
    assert r.exit_code == 0, r.output
    args = captured[-1][1]
    defaults = ServerArgs()
    assert (args.h11_max_incomplete_event_size, args.h11_max_header_count) == (4 << 20, 256)
    assert (args.timeout_request_header, args.timeout_request_body) == (30.0, 120.0)
    assert (args.max_connections, args.timeout_keep_alive) == (defaults.max_connections, 5.0)
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("h11-max-header-count: 50\ntimeout_request_body: 7\nmax-connections: 99\n")
    r = runner.invoke(
        app,
        ["serve", "--config", str(cfg), "--h11-max-incomplete-event-size", "1024", "--max-connections", "9"],
    )
    assert r.exit_code == 0, r.output
    args = captured[-1][1]
    assert (args.h11_max_incomplete_event_size, args.h11_max_header_count) == (1024, 50)
    assert (args.timeout_request_body, args.max_connections) == (7.0, 9)


@pytest.mark.parametrize(
    "flag",
    [
        "--h11-max-incomplete-event-size",
        "--h11-max-header-count",
        "--timeout-request-header",
        "--timeout-request-body",
        "--max-connections",
        "--timeout-keep-alive",
    ],
)
def test_non_positive_framing_limit_is_a_usage_error(captured, flag):
    r = runner.invoke(app, ["serve", flag, "0"])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and f"{flag} must be positive" in r.stderr
    assert not captured


def test_return_tokens_as_token_ids_flag_and_yaml(captured, tmp_path):
    """vLLM's --return-tokens-as-token-ids: the serving layer's default for every request."""
    assert runner.invoke(app, ["serve"]).exit_code == 0
    assert captured[-1][1].serving.return_tokens_as_token_ids is False
    r = runner.invoke(app, ["serve", "--return-tokens-as-token-ids"])
    assert r.exit_code == 0, r.output
    assert captured[-1][1].serving.return_tokens_as_token_ids is True
    cfg = tmp_path / "c.yaml"
    cfg.write_text("return-tokens-as-token-ids: true\n")
    assert runner.invoke(app, ["serve", "--config", str(cfg)]).exit_code == 0
    assert captured[-1][1].serving.return_tokens_as_token_ids is True


def test_response_role_flag_and_yaml(captured, tmp_path):
    """vLLM's --response-role (shared with fd run-batch): the role of a new turn's answer."""
    assert runner.invoke(app, ["serve"]).exit_code == 0
    assert captured[-1][1].serving.response_role == "assistant"
    r = runner.invoke(app, ["serve", "--response-role", "bot"])
    assert r.exit_code == 0, r.output
    assert captured[-1][1].serving.response_role == "bot"
    cfg = tmp_path / "c.yaml"
    cfg.write_text("response-role: helper\n")
    assert runner.invoke(app, ["serve", "--config", str(cfg)]).exit_code == 0
    assert captured[-1][1].serving.response_role == "helper"
