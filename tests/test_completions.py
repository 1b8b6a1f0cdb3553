"""The shell-completion scripts in completions/ are generated from the Typer app and must be current."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GEN = REPO / "completions" / "generate.py"


def test_scripts_are_not_stale():
    r = subprocess.run(
        [sys.executable, str(GEN), "--check"], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert r.returncode == 0, r.stderr


def test_check_detects_a_stale_script(tmp_path):
    sys.path.insert(0, str(GEN.parent))
    try:
        import generate
    finally:
        sys.path.pop(0)
    scripts = generate.render()
    assert set(scripts) == {"fd.bash", "fd.zsh", "fd.fish"}
    assert "--max-model-len" in scripts["fd.bash"] and "-l max-model-len" in scripts["fd.fish"]
    original = generate.HERE
    try:
        generate.HERE = tmp_path
        for name, text in scripts.items():
            (tmp_path / name).write_text(text.replace("--port", "--prt"))
        assert generate.main(["--check"]) == 1
        generate.main([])
        assert generate.main(["--check"]) == 0
    finally:
        generate.HERE = original


def _bash_complete(words: list[str]) -> list[str]:
    script = (
        f"source {REPO / 'completions' / 'fd.bash'}; COMP_WORDS=({' '.join(words)}); "
        f"COMP_CWORD={len(words) - 1}; _fd_completion; printf '%s\\n' \"${{COMPREPLY[@]}}\""
    )
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30).stdout.split()


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not installed")
def test_bash_completes_commands_and_flags():
    assert _bash_complete(["fd", "se"]) == ["serve"]
    assert "--port" in _bash_complete(["fd", "serve", "--po"])
    assert _bash_complete(["fd", "tokenizer", "enc"]) == ["encode"]
    assert "--max-tokens" in _bash_complete(["fd", "complete", "--max"])
