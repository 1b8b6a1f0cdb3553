"""`fd run-batch --data-parallel-size 2` when a rank's process is killed mid-run: the lines it held run
again on the live rank, so every input line gets exactly one record, each equal to a clean run's
(greedy lines: any rank gives the same answer, tests/parallel/test_data_parallel.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from batch.batch_helpers import REPO, chat_line, cli_args, completion_line, read_jsonl, run_cli, write_jsonl

from fdcli_engine.entrypoints.batch.files import partial_path

NUM_LINES = 40


def _rank_pids(parent: int) -> dict[int, int]:
    """Engine-core process of each data-parallel rank (from the config on its command line)."""
    import psutil

    out = {}
    for child in psutil.Process(parent).children():
        cmd = child.cmdline()
        if "fdcli_engine.api.core_proc" in cmd:
            out[json.loads(cmd[cmd.index("--config") + 1])["data_parallel_rank"]] = child.pid
    return out


def _records(path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _answers(path) -> dict[str, list]:
    """custom_id -> its choices; every custom_id once."""
    records = read_jsonl(path)
    ids = [r["custom_id"] for r in records]
    assert len(ids) == len(set(ids)), ids
    return {r["custom_id"]: (r["error"], r["response"]["body"]["choices"]) for r in records}


def test_a_killed_ranks_lines_run_on_the_live_rank(tiny_model, tmp_path):
    lines = [
        completion_line(f"c{i}", f"prompt {i} about {i * 7}", max_tokens=24, ignore_eos=True)
        for i in range(NUM_LINES)
    ]
    # A retried line keeps its own request id (the dead rank's request is gone from the front end), and
    # a line of two choices whose rank died holding one runs again whole.
    lines += [chat_line(f"h{i}", f"tell me about {i}", max_tokens=12, request_id=f"h{i}") for i in range(4)]
    lines += [completion_line(f"n{i}", f"two of {i}", max_tokens=24, ignore_eos=True, n=2) for i in range(4)]
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    clean = tmp_path / "clean.jsonl"
    proc = run_cli(cli_args(tiny_model, "-i", str(src), "-o", str(clean)))
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]

    out, summary = tmp_path / "out.jsonl", tmp_path / "summary.json"
    args = cli_args(tiny_model, "-i", str(src), "-o", str(out), "--data-parallel-size", "2")
    args += ["--max-inflight", "12", "--summary-json", str(summary)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while _records(partial_path(out)) < 2:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "no progress written"
            time.sleep(0.01)
        pids = _rank_pids(proc.pid)
        # Both cores frozen while the front end routes the window's lines to them, so rank 1 holds
        # some when it is killed; then rank 0 goes on alone.
        for pid in pids.values():
            os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(0.5)
            os.kill(pids[1], signal.SIGKILL)
        finally:
            os.kill(pids[0], signal.SIGCONT)
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    failed = [r["error"] for r in read_jsonl(out) if r["error"] is not None]
    assert proc.returncode == 0 and not failed, (failed, err.decode()[-3000:])
    assert json.loads(summary.read_text())["retried"] > 0, err.decode()[-3000:]
    want = _answers(clean)
    assert _answers(out) == want and all(error is None for error, _ in want.values())
