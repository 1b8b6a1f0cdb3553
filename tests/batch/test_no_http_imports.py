"""`fd run-batch` needs no web framework: a whole run (chat, completion and an embedding line on a
model-free engine) in a fresh process leaves FastAPI, Starlette and uvicorn unimported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from batch_helpers import chat_line, completion_line, write_jsonl

HERE = Path(__file__).resolve().parent

SCRIPT = """
import json, sys
sys.path.insert(0, {here!r})
from fake_engine import FakeEngine
from fdcli_engine.entrypoints.batch import BatchOptions, run_batch
import fdcli.commands.run_batch  # the CLI command too
from pathlib import Path
summary = run_batch(BatchOptions(Path({src!r}), Path({out!r}), progress=False), {{}}, lambda _: FakeEngine())
loaded = sorted(m for m in ("fastapi", "starlette", "uvicorn") if m in sys.modules)
print(json.dumps({{"succeeded": summary.succeeded, "failed": summary.failed, "loaded": loaded}}))
"""


def test_run_batch_imports_no_web_framework(tmp_path):
    lines = [
        chat_line("c", "hi", max_tokens=2),
        completion_line("p", "hello", max_tokens=2),
        {"custom_id": "e", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}},
    ]
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    code = SCRIPT.format(here=str(HERE), src=str(src), out=str(tmp_path / "out.jsonl"))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    # The embedding line fails (the fake engine has no pooler), as a record: every route was served.
    assert (got["succeeded"], got["failed"]) == (2, 1)
    assert got["loaded"] == []
