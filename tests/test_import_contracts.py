"""The import-linter contracts in pyproject.toml hold on the tree, and breaking one fails `lint-imports`.

Each case copies the packages and pyproject.toml to a temporary directory, adds one forbidden import to
one module there, and runs lint-imports on the copy: it must exit non-zero and report that contract
broken, while the untouched copy passes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("fdcli", "fdcli_engine", "kernels/fd_kernels")

CLI = "The CLI never reaches engine internals"
KERNELS = "fd_kernels imports nothing from fd"
LAYERS = "Layers: CLI > entrypoints > api > engine"
LEAVES = "Leaf modules import no layered module"


def _copy_tree(dest: Path) -> Path:
    for package in PACKAGES:
        shutil.copytree(ROOT / package, dest / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


def _lint_imports(tree: Path) -> subprocess.CompletedProcess:
    # Only the copy on the path: the contracts must be checked against it, not the installed packages.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(tree / "kernels")])}
    code = "import sys\nfrom importlinter.cli import lint_imports_command\nsys.exit(lint_imports_command())"
    return subprocess.run(
        [sys.executable, "-c", code, "--no-cache"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _broken(output: str) -> set[str]:
    """The contract names lint-imports reports as BROKEN (a long name wraps onto the next line)."""
    flat = " ".join(output.split())
    summary = flat[: flat.find("Broken contracts")]  # the status lines, before the details
    broken = set()
    for name in (CLI, KERNELS, LAYERS, LEAVES):
        start = summary.index(name)
        kept, bad = summary.find(" KEPT", start), summary.find(" BROKEN", start)
        if bad != -1 and (kept == -1 or bad < kept):
            broken.add(name)
    return broken


def test_the_tree_keeps_every_contract(tmp_path):
    proc = _lint_imports(_copy_tree(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "4 kept, 0 broken" in proc.stdout


@pytest.mark.parametrize(
    "module,line,contract",
    [
        ("fdcli/console.py", "import fdcli_engine.core", CLI),
        ("kernels/fd_kernels/packing.py", "import fdcli_engine", KERNELS),
        ("fdcli_engine/core/block_pool.py", "import fdcli_engine.api", LAYERS),
        ("fdcli_engine/layers/linear.py", "import fdcli_engine.models", LAYERS),
        ("fdcli_engine/outputs.py", "import fdcli_engine.runner", LEAVES),
    ],
)
def test_a_forbidden_import_fails_lint_imports(tmp_path, module, line, contract):
    tree = _copy_tree(tmp_path)
    path = tree / module
    path.write_text(path.read_text() + f"\n{line}  # noqa: E402, F401\n")
    proc = _lint_imports(tree)
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert contract in _broken(proc.stdout), proc.stdout[-3000:]
