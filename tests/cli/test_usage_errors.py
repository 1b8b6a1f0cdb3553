"""click's usage errors (unknown option, bad value type, extra argument, unknown command) are one
`Error: ...` line on stderr with exit 2 for every fd command, as the README promises; help is unchanged."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fdcli.main import app

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["serve", "--no-such-flag"], "No such option: --no-such-flag"),
        (["serve", "--port", "x"], "Invalid value for '--port'"),
        (["collect-env", "x"], "Got unexpected extra argument(s) (x)"),
        (["run-batch", "--bogus"], "No such option: --bogus"),
        (["bench", "serve", "--bogus"], "No such option: --bogus"),
        (["bench", "latency", "--max-num-seqs", "many"], "Invalid value for '--max-num-seqs'"),
        (["tokenizer", "encode", "--bogus", "x"], "No such option: --bogus"),
        (["chat", "--bogus"], "No such option: --bogus"),
        (["no-such-command"], "No such command 'no-such-command'"),
        (["--bogus"], "No such option: --bogus"),
    ],
)
def test_usage_error_is_one_line_and_exit_2(argv, needle):
    r = runner.invoke(app, argv)
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1, r.stderr
    assert needle in r.stderr and "--help" in r.stderr
    assert "╭" not in r.output and "Usage:" not in r.output


def test_help_is_unchanged():
    r = runner.invoke(app, ["serve", "--help"])
    assert r.exit_code == 0 and "Usage: fd serve" in r.output and "--max-model-len" in r.output
    r = runner.invoke(app, ["bench"])  # a bare group still prints its help
    assert "Usage: fd bench" in r.output and "Error" not in r.output


def test_console_script_prints_one_line():
    p = subprocess.run(
        [sys.executable, "-m", "fdcli.main", "serve", "--no-such-flag"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.startswith("Error: No such option: --no-such-flag") and p.stderr.count("\n") == 1
