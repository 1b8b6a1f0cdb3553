"""Product code never deserializes with pickle or evaluates strings as code (issue #28's CI guard).

A socket that unpickles, or an `eval` of request data, runs whatever a client sends. The scan walks
the syntax tree of every product module (fdcli, fdcli_engine, fd_kernels), so a mention in a
docstring or comment does not count, while an import, a call or an attribute use does. An exception
needs an entry in ALLOWED with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT_DIRS = ("fdcli", "fdcli_engine", "kernels/fd_kernels")

# Modules whose loaders run code from the data they read.
UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "marshal", "shelve", "joblib"}
UNSAFE_BUILTINS = {"eval", "exec", "compile", "__import__"}
# pyzmq's pickle helpers, and loaders that unpickle (paddle.load / torch.load read pickles).
UNSAFE_ATTRS = {"recv_pyobj", "send_pyobj", "recv_serialized", "send_serialized"}
UNSAFE_CALLS = {("paddle", "load"), ("torch", "load"), ("yaml", "load"), ("yaml", "unsafe_load")}

# "path relative to ROOT:name" -> why it is safe. Empty: product code has no exception today.
ALLOWED: dict[str, str] = {}


def findings(source: str) -> list[tuple[int, str]]:
    """(line, what) for every unsafe construct in `source`."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] in UNSAFE_MODULES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in UNSAFE_MODULES:
            found.append((node.lineno, node.module or ""))
        elif isinstance(node, ast.Name) and node.id in UNSAFE_BUILTINS:
            found.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute):
            if node.attr in UNSAFE_ATTRS:
                found.append((node.lineno, node.attr))
            elif isinstance(node.value, ast.Name) and (node.value.id, node.attr) in UNSAFE_CALLS:
                found.append((node.lineno, f"{node.value.id}.{node.attr}"))
        elif isinstance(node, ast.Call) and _allows_pickle(node):
            found.append((node.lineno, "allow_pickle=True"))
    return found


def _allows_pickle(call: ast.Call) -> bool:
    return any(
        kw.arg == "allow_pickle" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False)
        for kw in call.keywords
    )


def _product_files() -> list[Path]:
    files = [p for d in PRODUCT_DIRS for p in sorted((ROOT / d).rglob("*.py"))]
    assert len(files) > 50, f"the scan found only {len(files)} product files under {PRODUCT_DIRS}"
    return files


def test_product_code_has_no_pickle_eval_or_exec():
    bad = []
    for path in _product_files():
        rel = path.relative_to(ROOT).as_posix()
        for line, what in findings(path.read_text(encoding="utf-8")):
            if f"{rel}:{what}" not in ALLOWED:
                bad.append(f"{rel}:{line}: {what}")
    assert not bad, "unsafe deserialization or code evaluation in product code:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    "snippet, what",
    [
        ("import pickle", "pickle"),
        ("from dill import loads", "dill"),
        ("import cloudpickle as cp", "cloudpickle"),
        ("msg = sock.recv_pyobj()", "recv_pyobj"),
        ("x = eval(body)", "eval"),
        ("exec(code, {})", "exec"),
        ("f = getattr(builtins, 'x') or compile(src, 'f', 'exec')", "compile"),
        ("state = paddle.load(path)", "paddle.load"),
        ("w = torch.load(f)", "torch.load"),
        ("cfg = yaml.load(text)", "yaml.load"),
        ("a = np.load(p, allow_pickle=True)", "allow_pickle=True"),
    ],
)
def test_scanner_catches(snippet, what):
    assert [w for _, w in findings(snippet)] == [what]


@pytest.mark.parametrize(
    "snippet",
    [
        '"""never pickle; no eval( here"""',
        "# import pickle",
        "cfg = yaml.safe_load(text)",
        "a = np.load(p, allow_pickle=False)",
        "msg = msgspec.msgpack.decode(buf)",
        "x = evaluate(y)",
    ],
)
def test_scanner_passes_safe_code(snippet):
    assert findings(snippet) == []
