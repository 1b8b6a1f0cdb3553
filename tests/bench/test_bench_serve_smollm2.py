"""End to end: `fd bench serve` against a real `fd serve` on the default SmolLM2, 16 prompts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from server.fd_server import API_KEY

pytestmark = pytest.mark.slow


@pytest.fixture
def srv(smol_server):
    return smol_server


@pytest.mark.parametrize("backend", ["openai", "openai-chat"])
def test_bench_serve_against_fd_serve(srv, tmp_path, backend):
    out = tmp_path / "result.json"
    cmd = [sys.executable, "-m", "fdcli.main", "bench", "serve", "--base-url", srv.url,
           "--api-key", API_KEY, "--backend", backend, "--dataset", "random",
           "--random-input-len", "32", "--random-output-len", "8", "--num-prompts", "16",
           "--max-concurrency", "8", "--ignore-eos", "--seed", "1", "--save-result", str(out),
           "--no-progress", "--no-chart"]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    m = json.loads(out.read_text())["metrics"]
    assert m["completed"] == 16 and m["failed"] == 0
    # ignore_eos + max_tokens 8: the server's usage reports exactly 8 tokens per request.
    assert m["total_output_tokens"] == 16 * 8
    assert API_KEY not in run.stdout + run.stderr + out.read_text()
