"""Shared engine options: YAML + flags merge, the @engine_options decorator, and the error boundary."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from fdcli.console import BadInput, error_boundary
from fdcli.options import ENGINE_FLAGS, engine_config_from_cli, engine_options
from fdcli_engine.config import EngineConfig
from fdcli_engine.errors import ConfigError, InvalidRequestError, ModelLoadError


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.command()
    @engine_options
    def run(port: int = 8000, *, engine_args: dict) -> None:
        typer.echo(json.dumps({"port": port, **engine_args}))

    @app.command()
    def other() -> None:  # a second command so Typer keeps `run` as a subcommand
        pass

    return app


def test_every_engine_flag_is_an_engine_config_field():
    assert set(ENGINE_FLAGS) <= EngineConfig.field_names()


def test_flags_override_yaml(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("max-num-seqs: 8\nblock_size: 32\nenable_prefix_caching: true\n")
    merged = engine_config_from_cli(cfg, max_num_seqs=4, block_size=None, enable_prefix_caching=False)
    assert merged == {"max_num_seqs": 4, "block_size": 32, "enable_prefix_caching": False}
    assert EngineConfig.from_dict(merged).block_size == 32


def test_yaml_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("max_num_seqs: 8\nnot_an_option: 1\n")
    with pytest.raises(ConfigError, match="not_an_option"):
        engine_config_from_cli(bad)
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        engine_config_from_cli(bad)
    bad.write_text("a: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        engine_config_from_cli(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        engine_config_from_cli(tmp_path / "missing.yaml")


def test_pooler_config_is_json(tmp_path):
    assert engine_config_from_cli(None, pooler_config='{"pooling_type": "MEAN"}') == {
        "pooler_config": {"pooling_type": "MEAN"}
    }
    with pytest.raises(ConfigError, match="JSON object"):
        engine_config_from_cli(None, pooler_config="[1]")


def test_decorated_command_receives_merged_flags(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("max_num_seqs: 8\ndtype: auto\n")
    args = [
        "run",
        "--port",
        "9",
        "--config",
        str(cfg),
        "--max-num-seqs",
        "2",
        "--no-enable-chunked-prefill",
        "-m",
        "/x.gguf",
        "--kv-cache-memory-gb",
        "0.5",
    ]
    result = CliRunner().invoke(_app(), args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {
        "port": 9,
        "max_num_seqs": 2,
        "dtype": "auto",
        "enable_chunked_prefill": False,
        "model": "/x.gguf",
        "kv_cache_memory_gb": 0.5,
    }


def test_decorated_command_reports_bad_config_in_one_line(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("max_num_seq: 8\n")  # typo
    result = CliRunner().invoke(_app(), ["run", "--config", str(cfg)])
    assert result.exit_code == 2
    assert (
        result.stderr.count("\n") == 1 and "max_num_seq" in result.stderr and "Traceback" not in result.output
    )


def test_decorator_requires_engine_args():
    with pytest.raises(TypeError, match="engine_args"):
        engine_options(lambda port=1: None)


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (ConfigError("bad\nflag"), 2),
        (InvalidRequestError("bad req"), 2),
        (BadInput("x"), 2),
        (ModelLoadError("corrupt"), 1),
    ],
)
def test_error_boundary_exit_codes(exc, code, capsys):
    with pytest.raises(typer.Exit) as info, error_boundary():
        raise exc
    assert info.value.exit_code == code
    err = capsys.readouterr().err
    assert err.startswith("Error: ") and err.count("\n") == 1  # multi-line messages are collapsed


def test_error_boundary_httpx_connect_error(capsys):
    httpx = pytest.importorskip("httpx")
    with pytest.raises(typer.Exit) as info, error_boundary():
        httpx.get("http://127.0.0.1:9/v1/models", timeout=2)  # port 9 (discard): connection refused
    assert info.value.exit_code == 1
    err = capsys.readouterr().err
    assert (
        err.startswith("Error: cannot reach the server at http://127.0.0.1:9/v1/models")
        and err.count("\n") == 1
    )


def test_error_boundary_lets_bugs_through():
    with pytest.raises(ZeroDivisionError), error_boundary():
        1 / 0  # noqa: B018


def test_serve_stub_reports_config_file_errors(tmp_path):
    from fdcli.main import app

    result = CliRunner().invoke(app, ["serve", "--config", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2 and result.stderr.startswith("Error: cannot read --config")


def test_generation_config_flags_and_yaml_keys(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("generation-config: vllm\noverride_generation_config:\n  top_k: 1\n")
    assert engine_config_from_cli(cfg) == {
        "generation_config": "vllm",
        "override_generation_config": {"top_k": 1},
    }
    flags = engine_config_from_cli(
        None, generation_config="/m", override_generation_config='{"temperature": 0.5}'
    )
    assert flags == {"generation_config": "/m", "override_generation_config": {"temperature": 0.5}}


@pytest.mark.parametrize(
    "args, message",
    [
        (["--override-generation-config", "{bad"], "--override-generation-config must be a JSON object"),
        (["--override-generation-config", '{"seed": 1}'], "unknown key(s) seed; it takes temperature"),
        (["--generation-config", "TMP/none"], "no generation_config.json there; use auto"),
    ],
)
def test_serve_reports_bad_generation_config_in_one_line(tmp_path, args, message):
    from fdcli.main import app

    args = [a.replace("TMP", str(tmp_path)) for a in args]
    result = CliRunner().invoke(app, ["serve", "--model", str(tmp_path), *args])
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and message in result.stderr and "Traceback" not in result.output
