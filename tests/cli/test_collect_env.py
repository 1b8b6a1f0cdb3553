"""`fd collect-env`: JSON shape, real versions, and that secrets never reach the output."""

from __future__ import annotations

import json
from importlib.metadata import version

from typer.testing import CliRunner

from fdcli.commands.collect_env import REDACTED, redact_env
from fdcli.main import app

runner = CliRunner()
SECRET_ENV = {
    "OPENAI_API_KEY": "sk-live-123456",
    "HF_TOKEN": "hf_abcdef",
    "FD_PASSWORD": "hunter2",
    "FD_SERVER_URL": "sk-looks-like-a-key",
    "FD_PROXY": "http://user:pw@proxy:3128",
    "FD_LOG_LEVEL": "debug",
    "OMP_NUM_THREADS": "2",
    "UNRELATED_VAR": "x",
}


def test_redact_env():
    out = redact_env(SECRET_ENV)
    assert out == {
        "FD_LOG_LEVEL": "debug",
        "FD_PASSWORD": REDACTED,
        "FD_PROXY": REDACTED,
        "FD_SERVER_URL": REDACTED,
        "HF_TOKEN": REDACTED,
        "OMP_NUM_THREADS": "2",
        "OPENAI_API_KEY": REDACTED,
    }


def test_json_report_without_paddle(monkeypatch):
    for k, v in SECRET_ENV.items():
        monkeypatch.setenv(k, v)
    result = runner.invoke(app, ["collect-env", "--json", "--no-paddle"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert {"os", "cpu", "memory", "python", "paddle", "gpus", "packages", "env"} <= data.keys()
    assert data["packages"]["paddlepaddle"] == version("paddlepaddle")
    assert data["packages"]["typer"] == version("typer")
    assert data["env"]["FD_LOG_LEVEL"] == "debug" and "UNRELATED_VAR" not in data["env"]
    for secret in ("sk-live-123456", "hf_abcdef", "hunter2", "sk-looks-like-a-key", "user:pw"):
        assert secret not in result.stdout
    assert data["cpu"]["logical_cores"] >= 1 and data["memory"]["total_gib"] > 0
    assert isinstance(data["cpu"]["flags"], dict) and "avx2" in data["cpu"]["flags"]


def test_json_report_with_paddle():
    from fd_kernels import native

    native.load()  # built (or imported from the cache) here, so the probe reports the level, not "not built"
    data = json.loads(runner.invoke(app, ["collect-env", "--json"]).stdout)
    assert data["kernels"] == f"{native.active_isa()} (GGUF rows: {native.qgemm_path()})"
    assert data["paddle"]["version"] == version("paddlepaddle")
    cpu_wheel = data["packages"]["paddlepaddle-gpu"] == "not installed"
    assert data["paddle"]["compiled_with_cuda"] is (not cpu_wheel)
    if cpu_wheel:
        assert data["paddle"]["device"] == "cpu"


def test_table_output_redacts(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-live-123456")
    result = runner.invoke(app, ["collect-env", "--no-paddle"])
    assert result.exit_code == 0
    assert "packages" in result.stdout and "OPENAI_API_KEY" in result.stdout and REDACTED in result.stdout
    assert "sk-live-123456" not in result.stdout


def test_broken_paddle_is_reported_not_raised(monkeypatch):
    from fdcli.commands import collect_env

    monkeypatch.setattr(collect_env, "_PADDLE_PROBE", "raise ImportError('libpaddle.so: cannot open')")
    assert collect_env._paddle_info() == {
        "error": "import paddle failed: ImportError: libpaddle.so: cannot open"
    }
