"""`fd` starts fast: importing the CLI pulls in no paddle, torch, transformers or engine internals."""

from __future__ import annotations

import json
import subprocess
import sys

from typer.testing import CliRunner

from fdcli.main import app

HEAVY = (
    "paddle",
    "torch",
    "transformers",
    "rich.progress",
    "fdcli_engine.core",
    "fdcli_engine.runner",
    "fdcli_engine.models",
    "fdcli_engine.layers",
    "fdcli_engine.ops",
    "fdcli_engine.engine",
    "fd_kernels",
)


def _modules_after(code: str) -> set[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def _heavy(mods: set[str]) -> set[str]:
    return {m for m in mods if any(m == h or m.startswith(h + ".") for h in HEAVY)}


def test_importing_the_cli_loads_no_heavy_module():
    mods = _modules_after("import fdcli, fdcli.main")
    assert "fdcli.main" in mods  # the probe really imported the CLI
    assert _heavy(mods) == set()


def test_fd_help_loads_no_heavy_module():
    # Runs the real entry point, as `fd --help` would, then inspects what got imported.
    code = "import sys\nfrom fdcli.main import app\ntry:\n    app(['--help'], prog_name='fd')\nexcept SystemExit:\n    pass"
    mods = _modules_after(code)
    assert _heavy(mods) == set()


def test_help_lists_every_command():
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    for name in ("serve", "chat", "complete", "run-batch", "tokenizer", "collect-env"):
        assert name in result.stdout


def test_version():
    from importlib.metadata import version

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.strip() == f"fd {version('fd-llm')}"


def test_unknown_command_is_a_usage_error():
    result = CliRunner().invoke(app, ["no-such-command"])
    assert result.exit_code == 2


LINTER_CONFIG = """
[importlinter]
root_packages =
    fdcli
    fdcli_engine
include_external_packages = True

[importlinter:contract:cli]
name = The CLI never reaches engine internals
type = forbidden
source_modules =
    fdcli
forbidden_modules =
    fdcli_engine.core
    fdcli_engine.runner
    fdcli_engine.models
    fdcli_engine.layers
    fdcli_engine.ops
    paddle
allow_indirect_imports = True
"""


def test_import_linter_contract(tmp_path):
    # Also counts imports inside functions, which the sys.modules probes above cannot see.
    import shutil

    import pytest

    pytest.importorskip("importlinter")
    exe = shutil.which("lint-imports") or pytest.skip("lint-imports not on PATH")
    cfg = tmp_path / "importlinter.ini"
    cfg.write_text(LINTER_CONFIG)
    res = subprocess.run(
        [exe, "--config", str(cfg), "--no-cache"], capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stdout[-2000:]
