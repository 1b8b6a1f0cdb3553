"""Bounded memory: a large input streams through run-batch (model-free engine) without being held.

The input is ~48 MB; holding it (or its parsed lines, several times larger) would grow the peak RSS
by far more than the bound. What legitimately grows: the custom_id index (~20k short strings) and
the in-flight window."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from batch_helpers import REPO, chat_line, completion_line, write_jsonl

NUM_LINES = 20_000
PROMPT_CHARS = 2_400
BOUND_MB = 24  # half the input size


def test_peak_rss_growth_is_bounded_on_a_large_input(tmp_path):
    src = tmp_path / "big.jsonl"
    filler = "lorem ipsum " * (PROMPT_CHARS // 12)
    with open(src, "w", encoding="utf-8") as f:
        for i in range(NUM_LINES):
            line = chat_line(f"c{i}", filler, 3) if i % 2 else completion_line(f"p{i}", filler, 3)
            f.write(json.dumps(line) + "\n")
    size_mb = src.stat().st_size / 2**20
    assert size_mb > 2 * BOUND_MB
    warmup = write_jsonl(tmp_path / "warm.jsonl", [chat_line("w", "x", 3), completion_line("v", "y", 3)])
    out = tmp_path / "out.jsonl"
    probe = Path(__file__).with_name("memory_probe.py")
    proc = subprocess.run(
        [sys.executable, str(probe), str(src), str(out), str(warmup)],
        cwd=REPO,
        capture_output=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    figures = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    assert figures["succeeded"] == NUM_LINES
    growth_mb = (figures["peak_kb"] - figures["baseline_kb"]) / 1024
    assert growth_mb < BOUND_MB, f"peak RSS grew {growth_mb:.1f} MB on a {size_mb:.0f} MB input"
    with open(out, "rb") as f:  # every line answered, in order
        for i, raw in enumerate(f):
            assert json.loads(raw)["custom_id"] == (f"c{i}" if i % 2 else f"p{i}")
    assert i == NUM_LINES - 1
