"""run-batch's default engine is the server's AsyncLLM, its core in a process of its own: the answers
equal the in-process client's, and however the run ends (done, core failed to start, core killed,
Ctrl-C, SIGTERM) the core is stopped and reaped, the exit is one clean line, and OUT.partial keeps
whole records that --resume completes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from batch_helpers import (
    ENGINE_ARGS,
    REPO,
    chat_line,
    cli_args,
    completion_line,
    core_pids,
    is_gone,
    read_jsonl,
    run_cli,
    write_jsonl,
)
from test_run_batch import GOOD_LINES, _comparable, assert_same

from fdcli_engine.entrypoints.batch import BatchOptions, run_batch
from fdcli_engine.entrypoints.batch.dispatcher import BatchRunError
from fdcli_engine.entrypoints.batch.files import partial_path

NUM_LINES = 60


def _engine_args(tiny_model) -> dict:
    return {"model": str(tiny_model), "served_model_name": "tiny", **ENGINE_ARGS}


def test_core_process_answers_equal_the_in_process_client(tmp_path, tiny_model, shared_core, engine_factory):
    lines = GOOD_LINES + [chat_line("bad-len", "x", max_tokens=1000)]  # a 400 record from the serving layer
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    core = shared_core[0]
    # A cold prefix cache on both sides (usage reports cached tokens), and none left for later tests.
    core.reset_prefix_cache()
    try:
        reference = run_batch(BatchOptions(src, tmp_path / "ref.jsonl", progress=False), {}, engine_factory)
    finally:
        core.reset_prefix_cache()
    out = tmp_path / "out.jsonl"
    summary = run_batch(BatchOptions(src, out, progress=False), _engine_args(tiny_model))  # default engine
    assert core_pids(os.getpid()) == []  # the core was stopped and reaped before run_batch returned
    assert (summary.status, summary.succeeded, summary.failed) == ("lines_failed", len(GOOD_LINES), 1)
    assert (summary.prompt_tokens, summary.completion_tokens) == (
        reference.prompt_tokens,
        reference.completion_tokens,
    )
    got, want = read_jsonl(out), read_jsonl(tmp_path / "ref.jsonl")
    assert [r["custom_id"] for r in got] == [line["custom_id"] for line in lines]
    for g, w in zip(got, want):
        assert g["response"]["status_code"] == w["response"]["status_code"], g["custom_id"]
        if w["error"] is None:
            assert g["error"] is None
            assert_same(
                _comparable(g["response"]["body"]), _comparable(w["response"]["body"]), g["custom_id"]
            )
        else:
            assert g["error"]["code"] == w["error"]["code"] and g["error"]["message"] == w["error"]["message"]


def test_a_core_that_fails_to_start_is_a_run_error_and_leaves_nothing(tmp_path, shared_core):
    from fdcli_engine.api.async_llm import AsyncLLM

    _, tokenizer, config = shared_core
    src = write_jsonl(tmp_path / "in.jsonl", [completion_line("a", "hi", 3)])
    out = tmp_path / "out.jsonl"

    def factory(_):
        return AsyncLLM(config, tokenizer, core_spec="fdcli_engine.no_such_module:EngineCore", core_stdout=2)

    with pytest.raises(BatchRunError, match="failed to start: ModuleNotFoundError"):
        run_batch(BatchOptions(src, out, progress=False), {}, factory)
    assert core_pids(os.getpid()) == []
    assert not out.exists() and not partial_path(out).exists()


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _default_sigint() -> None:
    # A terminal's foreground job: SIGINT at its default, even when this test runs as a background job
    # (which inherits SIGINT ignored and would pass that on).
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_cli(tmp_path, *extra: str, sigint_ignored: bool = False):
    """A run-batch subprocess in its own session (a process group, as a terminal's foreground job),
    slow enough per line to be caught mid-run; returns (proc, args, out). `sigint_ignored`: started
    as a script's background job is (`fd run-batch ... &` in sh inherits SIGINT ignored)."""
    lines = [
        completion_line(f"id-{i}", f"prompt {i}", max_tokens=40, ignore_eos=True) for i in range(NUM_LINES)
    ]
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    args = list(extra) + ["-i", str(src), "-o", str(out), "--max-inflight", "4", "--max-num-seqs", "4"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        args, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
        preexec_fn=_ignore_sigint if sigint_ignored else _default_sigint,
    )  # fmt: skip
    return proc, args, out


def _wait_for_records(proc, out, n: int) -> int:
    """Until OUT.partial holds `n` complete records; returns the pid of the run's engine core."""
    part = partial_path(out)
    deadline = time.monotonic() + 240
    while True:
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, "no progress written"
        done = part.read_bytes().count(b"\n") if part.exists() else 0
        pids = core_pids(proc.pid)
        if done >= n and pids:
            return pids[0]
        time.sleep(0.02)


def _finish(proc) -> str:
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return err.decode()


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm", "sigterm-background"])
def test_interrupt_keeps_whole_records_stops_the_core_and_resume_completes(tmp_path, tiny_model, how):
    summary_file = tmp_path / "summary.json"
    proc, args, out = _start_cli(
        tmp_path, *cli_args(tiny_model), "--summary-json", str(summary_file),
        sigint_ignored=how == "sigterm-background",
    )  # fmt: skip
    core = _wait_for_records(proc, out, 8)
    if how == "ctrl-c":  # a terminal signals the whole foreground group: the core ignores it
        os.killpg(proc.pid, signal.SIGINT)
    else:  # `kill PID`: the front end alone
        proc.send_signal(signal.SIGTERM)
    err = _finish(proc)
    assert proc.returncode == 130, err[-2000:]
    assert err.strip().splitlines()[-1] == "Aborted."
    assert "Traceback" not in err and "FatalError" not in err, err[-2000:]
    assert is_gone(core)  # stopped and reaped by the front end before it exited
    assert not out.exists(), "the run finished before the signal; the test needs more work per line"
    before = partial_path(out).read_bytes()
    assert before.endswith(b"\n")  # only whole records: the run stops between two writes
    kept = [json.loads(x) for x in before.splitlines()]
    assert 8 <= len(kept) < NUM_LINES
    assert [r["custom_id"] for r in kept] == [f"id-{i}" for i in range(len(kept))]
    summary = json.loads(summary_file.read_text())
    assert (summary["status"], summary["message"], summary["succeeded"]) == (
        "failed",
        "interrupted",
        len(kept),
    )

    rerun = run_cli(
        args[: args.index("--summary-json")] + args[args.index("--summary-json") + 2 :] + ["--resume"]
    )
    assert rerun.returncode == 0, rerun.stderr.decode()[-2000:]
    assert f"{len(kept)} skipped" in rerun.stderr.decode()
    after = out.read_bytes()
    assert after.startswith(before)  # the records written before the signal, byte for byte
    records = read_jsonl(out)
    assert [r["custom_id"] for r in records] == [f"id-{i}" for i in range(NUM_LINES)]  # each exactly once
    assert all(r["response"]["body"]["usage"]["completion_tokens"] == 40 for r in records)


def test_a_core_killed_mid_run_fails_the_run_with_one_line(tmp_path, tiny_model):
    proc, _, out = _start_cli(tmp_path, *cli_args(tiny_model))
    core = _wait_for_records(proc, out, 4)
    os.kill(core, signal.SIGKILL)
    err = _finish(proc)
    assert proc.returncode == 1, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("Error: the engine failed at line") and "exited with code -9" in last, last
    assert not out.exists()
    kept = read_jsonl(partial_path(out))  # kept for --resume
    assert len(kept) >= 4 and all(r["error"] is None for r in kept)
