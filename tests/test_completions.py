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


def _fish_complete(line: str, script_path: Path = REPO / "completions" / "fd.fish") -> list[str]:
    script = f"source {script_path}; complete -C '{line}'"
    out = subprocess.run(
        ["fish", "--no-config", "-c", script], capture_output=True, text=True, timeout=30
    ).stdout
    return [row.split("\t")[0] for row in out.splitlines()]


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish not installed")
def test_fish_completes_commands_and_flags():
    assert _fish_complete("fd se") == ["serve"]
    assert _fish_complete("fd tokenizer enc") == ["encode"]
    assert "--max-tokens" in _fish_complete("fd complete --max")
    # The first and last flags of the one call that lists them, continued over lines with backslashes.
    assert {"--allow-credentials", "--uvicorn-log-level", "-tp", "-m"} <= set(_fish_complete("fd serve -"))
    assert "--host" not in _fish_complete("fd tokenizer encode --")


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish not installed")
def test_fish_completes_the_values_of_a_choice_option(tmp_path):
    sys.path.insert(0, str(GEN.parent))
    try:
        import generate
    finally:
        sys.path.pop(0)
    tree = {
        "": {"options": ["--verbose"], "choices": {}, "subcommands": {"run": "Run it"}},
        "run": {
            "options": ["--fast", "--mode", "-x"],
            "choices": {"--mode": ["eager", "lazy"]},
            "subcommands": {},
        },
    }
    script = tmp_path / "fd.fish"
    script.write_text(generate.fish_script(tree))
    assert _fish_complete("fd run --mode ", script) == ["eager", "lazy"]
    assert sorted(_fish_complete("fd run -", script)) == ["--fast", "--mode", "-x"]
    assert _fish_complete("fd -", script) == ["--verbose"]


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish not installed")
def test_fish_completes_exactly_each_commands_own_options():
    # `fd bench serve` must not also be offered `fd serve`'s flags (both paths hold the word "serve").
    sys.path.insert(0, str(GEN.parent))
    try:
        import generate
    finally:
        sys.path.pop(0)
    for path, node in generate.command_tree().items():
        offered = {w for w in _fish_complete(f"fd {path} -".replace("  ", " ")) if w.startswith("-")}
        assert offered == set(node["options"]), path
