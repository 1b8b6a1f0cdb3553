"""Helpers the run-batch tests import: batch files, the CLI as a subprocess, the engine-core processes.
Not in conftest.py: a test importing `conftest` gets whichever directory's conftest pytest loaded last
when several test directories are collected in one run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Small engine for every test: a 128-token context so "prompt longer than the context" is cheap.
ENGINE_ARGS = {"max_model_len": 128, "num_kv_blocks": 64, "max_num_seqs": 8, "threads": 1, "seed": 0}


def write_jsonl(path: Path, lines: list) -> Path:
    """Objects are dumped as JSON; strings are written verbatim (for malformed lines)."""
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in Path(path).read_text(encoding="utf-8").splitlines() if x.strip()]


def chat_line(custom_id: str, content: str, max_tokens: int = 8, **body) -> dict:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        **body,
    }
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def completion_line(custom_id: str, prompt, max_tokens: int = 8, **body) -> dict:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **body}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": body}


def cli_args(model: Path, *extra: str) -> list[str]:
    args = [
        sys.executable,
        "-m",
        "fdcli.main",
        "run-batch",
        "--model",
        str(model),
        "--served-model-name",
        "tiny",
    ]
    for key, value in ENGINE_ARGS.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return args + list(extra)


def run_cli(args: list[str], timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(args, cwd=REPO, env=env, capture_output=True, timeout=timeout, **kw)


def core_pids(parent: int) -> list[int]:
    """Engine-core processes (`python -m fdcli_engine.api.core_proc`) whose parent is `parent`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue  # exited meanwhile
        if ppid == parent and b"fdcli_engine.api.core_proc" in cmdline:
            pids.append(int(entry.name))
    return pids


def is_gone(pid: int) -> bool:
    """The process has exited (a zombie waiting for a reaper counts as exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")
