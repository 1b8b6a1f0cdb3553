"""`fd run-batch --distributed-executor-backend ray` on a local Ray cluster that this module starts
(`ray start --head --num-cpus 2`, its own temp dir), 2 actors of 1 CPU each on the tiny Llama:
the output equals the single-process run's line by line; an actor SIGKILLed mid-run has its lines
retried on the other one; the driver SIGKILLed mid-run, then --resume, gives every custom_id once;
without Ray the option is one error line."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from batch_helpers import (
    REPO,
    chat_line,
    cli_args,
    completion_line,
    is_gone,
    read_jsonl,
    run_cli,
    write_jsonl,
)

from fdcli_engine.entrypoints.batch.files import partial_path

RAY_MISSING = "Error: Ray is not installed: pip install 'fd-llm[ray]'\n"
READY = re.compile(r"Ray actor (\d+) ready: pid (\d+)")
# Token authentication off for the test's cluster and its drivers alike: `ray start` turns it on by
# itself when ~/.ray/auth_token exists (any earlier local `ray.init()` writes one), and a driver given
# an explicit address then connects without the token.
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


def _env() -> dict:
    path = os.pathsep.join([str(REPO), str(REPO / "kernels"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, **RAY_ENV}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_address():
    """A 2-CPU Ray head on this machine for the module. Its processes share one process group (its
    own session), which teardown kills: `ray stop` would stop every Ray cluster of this user."""
    temp = tempfile.mkdtemp(prefix="fdray-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    port = _free_port()
    ray_bin = str(Path(sys.executable).with_name("ray"))
    args = [ray_bin, "start", "--head", "--num-cpus", "2", "--node-ip-address", "127.0.0.1"]
    args += ["--port", str(port), "--temp-dir", temp, "--include-dashboard", "false", "--disable-usage-stats"]
    proc = subprocess.Popen(
        args, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    saved = {k: os.environ.get(k) for k in RAY_ENV}
    os.environ.update(RAY_ENV)  # for the drivers that run_cli starts
    try:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out.decode()[-2000:]
        yield f"127.0.0.1:{port}"
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            time.sleep(1.0)
        shutil.rmtree(temp, ignore_errors=True)


def _lines(num: int, max_tokens: int = 8) -> list:
    lines = [completion_line(f"c{i}", f"prompt {i}", max_tokens=max_tokens) for i in range(num)]
    lines += [chat_line("h1", "hi", max_tokens=max_tokens), chat_line("h2", "hey you", max_tokens=max_tokens)]
    lines.insert(3, "not json")  # an error record made by the driver, in its place
    lines.insert(5, completion_line("too-long", "x " * 200))  # an error record made by an actor
    return lines


def _comparable(record: dict) -> dict:
    """The record without what is random per run: record id, request id, response id and time."""
    r = {k: v for k, v in record.items() if k != "id"}
    if r["response"] is not None:
        r["response"] = {k: v for k, v in r["response"].items() if k != "request_id"}
        body = r["response"]["body"]
        if isinstance(body, dict) and r["error"] is None:
            r["response"]["body"] = {k: v for k, v in body.items() if k not in ("id", "created")}
    return r


class _Run:
    """`fd run-batch` as a child process whose stderr is read as it comes (the actors' pids)."""

    def __init__(self, args: list[str]):
        self.proc = subprocess.Popen(
            args, cwd=REPO, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        self.err: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for raw in self.proc.stderr:
            self.err.append(raw.decode(errors="replace"))

    def text(self) -> str:
        return "".join(self.err)

    def actor_pids(self) -> dict[int, int]:
        return {int(m[1]): int(m[2]) for m in READY.finditer(self.text())}

    def finish(self, timeout: float = 240) -> int:
        rc = self.proc.wait(timeout)
        self._reader.join(10)
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _wait(cond, run: _Run, what: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert run.proc.poll() is None, f"the run ended before {what}: {run.text()[-2000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {run.text()[-2000:]}"
        time.sleep(0.02)


def _complete_lines(path: Path) -> list[bytes]:
    if not path.exists():
        return []
    return [x for x in path.read_bytes().split(b"\n")[:-1] if x]


def _ray_args(model, ray_address, *extra) -> list[str]:
    return cli_args(model, *extra, "--distributed-executor-backend", "ray", "--ray-address", ray_address)


def test_ray_missing_is_one_error_line_and_plain_run_batch_never_imports_ray(tmp_path, tiny_model):
    src = write_jsonl(tmp_path / "in.jsonl", _lines(2))
    out = tmp_path / "out.jsonl"
    # sys.modules["ray"] = None: `import ray` raises ImportError, as on a machine without the extra.
    blocked = "import sys, runpy; sys.modules['ray'] = None; sys.argv = sys.argv[1:]; runpy.run_module('fdcli.main', run_name='__main__')"
    args = cli_args(tiny_model, "-i", str(src), "-o", str(out), "--distributed-executor-backend", "ray")
    proc = run_cli([sys.executable, "-c", blocked, *args[2:]])
    assert proc.returncode == 2
    assert proc.stderr.decode() == RAY_MISSING
    assert not out.exists() and not partial_path(out).exists()

    probe = (
        "import atexit, sys, runpy; atexit.register(lambda: sys.stderr.write(f'RAY-IMPORTED {\"ray\" in sys.modules}\\n'));"
        " sys.argv = sys.argv[1:]; runpy.run_module('fdcli.main', run_name='__main__')"
    )
    plain = run_cli([sys.executable, "-c", probe, *cli_args(tiny_model, "-i", str(src), "-o", str(out))[2:]])
    assert plain.returncode == 3, plain.stderr.decode()[-2000:]  # the two bad lines
    assert "RAY-IMPORTED False" in plain.stderr.decode()


def test_two_actors_output_equals_the_single_process_run(tmp_path, tiny_model, ray_address):
    src = write_jsonl(tmp_path / "in.jsonl", _lines(20))
    single, on_ray = tmp_path / "single.jsonl", tmp_path / "ray.jsonl"
    proc = run_cli(cli_args(tiny_model, "-i", str(src), "-o", str(single)))
    assert proc.returncode == 3, proc.stderr.decode()[-2000:]
    proc = run_cli(_ray_args(tiny_model, ray_address, "-i", str(src), "-o", str(on_ray)))
    err = proc.stderr.decode()
    assert proc.returncode == 3, err[-2000:]
    pids = {int(m[1]): int(m[2]) for m in READY.finditer(err)}
    assert sorted(pids) == [0, 1] and len(set(pids.values())) == 2, err
    answered = re.search(r"lines answered per Ray actor: 0: (\d+), 1: (\d+) \(0 retried\)", err)
    assert answered and int(answered[1]) > 0 and int(answered[2]) > 0, err  # both actors worked
    want, got = read_jsonl(single), read_jsonl(on_ray)
    assert len(got) == len(want) == 24
    for i, (g, w) in enumerate(zip(got, want)):
        assert _comparable(g) == _comparable(w), f"output line {i + 1}"
    assert got[3]["error"]["code"] == "invalid_json" and got[5]["error"] is not None


def test_an_actor_killed_mid_run_has_its_lines_retried_on_the_other(tmp_path, tiny_model, ray_address):
    num = 40
    lines = [completion_line(f"id-{i}", f"prompt {i}", max_tokens=40, ignore_eos=True) for i in range(num)]
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    run = _Run(_ray_args(tiny_model, ray_address, "-i", str(src), "-o", str(out), "--max-num-seqs", "4"))
    try:
        _wait(
            lambda: len(run.actor_pids()) == 2 and _complete_lines(partial_path(out)), run, "the first record"
        )
        victim = run.actor_pids()[1]
        os.kill(victim, signal.SIGKILL)
        assert not out.exists(), "the run finished before the kill; the test needs more work per line"
        rc = run.finish()
    finally:
        run.kill()
    err = run.text()
    assert rc == 0, err[-2000:]
    assert f"Ray actor 1 (pid {victim} on" in err and "failed" in err, err[-2000:]
    retried = re.search(r"lines answered per Ray actor: 0: (\d+), 1: (\d+) \((\d+) retried\)", err)
    assert retried and int(retried[3]) > 0, err[-2000:]  # the killed actor held lines, answered elsewhere
    records = read_jsonl(out)
    assert [r["custom_id"] for r in records] == [f"id-{i}" for i in range(num)]  # each once, in order
    single = tmp_path / "single.jsonl"
    proc = run_cli(cli_args(tiny_model, "-i", str(src), "-o", str(single), "--max-num-seqs", "4"))
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    want = read_jsonl(single)
    for i, (g, w) in enumerate(zip(records, want)):  # the retried lines' answers too
        assert _comparable(g) == _comparable(w), f"output line {i + 1}"
    assert all(r["response"]["body"]["usage"]["completion_tokens"] == 40 for r in records)


def test_more_actors_than_the_cluster_fits_is_one_error_line(tmp_path, tiny_model, ray_address):
    src = write_jsonl(tmp_path / "in.jsonl", _lines(2))
    out = tmp_path / "out.jsonl"
    proc = run_cli(_ray_args(tiny_model, ray_address, "-i", str(src), "-o", str(out), "-dp", "3"))
    assert proc.returncode == 2
    assert proc.stderr.decode() == (
        "Error: 3 Ray actor(s) of 1 CPU(s) each (--data-parallel-size, --threads) do not fit the Ray "
        "cluster: 2 CPU(s), at most 2 on one node\n"
    )
    assert not out.exists() and not partial_path(out).exists()


def test_driver_killed_mid_run_then_resume_gives_each_custom_id_once(tmp_path, tiny_model, ray_address):
    num = 40
    lines = [completion_line(f"id-{i}", f"prompt {i}", max_tokens=40, ignore_eos=True) for i in range(num)]
    lines.insert(7, "not json")  # an error record without custom_id must not be written twice either
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    part = partial_path(out)
    args = _ray_args(tiny_model, ray_address, "-i", str(src), "-o", str(out), "--max-num-seqs", "4")
    run = _Run(args)
    try:
        _wait(lambda: len(_complete_lines(part)) >= 12 and len(run.actor_pids()) == 2, run, "12 records")
        actors = list(run.actor_pids().values())
        run.proc.send_signal(signal.SIGKILL)
        run.finish(30)
    finally:
        run.kill()
    assert run.proc.returncode == -signal.SIGKILL
    assert not out.exists(), "the run finished before the kill; the test needs more work per line"
    deadline = time.monotonic() + 60
    while not all(is_gone(pid) for pid in actors):  # Ray ends a dead driver's actors
        assert time.monotonic() < deadline, "the Ray actors outlived their killed driver"
        time.sleep(0.05)
    before = _complete_lines(part)
    assert 12 <= len(before) < num + 1

    rerun = run_cli(args + ["--resume"])
    err = rerun.stderr.decode()
    assert rerun.returncode == 3, err[-2000:]  # the bad line keeps the exit at 3
    assert f"{len(before)} skipped" in err
    assert not part.exists()
    after = out.read_bytes().split(b"\n")[:-1]
    assert after[: len(before)] == before  # earlier results unchanged, byte for byte
    records = read_jsonl(out)
    ids = [r["custom_id"] for r in records if r["custom_id"] is not None]
    assert sorted(ids) == sorted(f"id-{i}" for i in range(num))  # each exactly once
    errors = [r for r in records if r["custom_id"] is None]
    assert len(errors) == 1 and errors[0]["error"]["line"] == 8
    for r in records:
        if r["error"] is None:
            assert r["response"]["body"]["usage"]["completion_tokens"] == 40
    assert json.loads(after[-1])  # the last line is complete


def test_only_run_batch_takes_the_ray_backend(tiny_model):
    from fdcli_engine import LLM
    from fdcli_engine.errors import ConfigError

    with pytest.raises(
        ConfigError, match=r"LLM\(distributed_executor_backend='ray'\): the in-process engine"
    ):
        LLM(str(tiny_model), distributed_executor_backend="ray")
    args = [
        sys.executable,
        "-m",
        "fdcli.main",
        "serve",
        "--model",
        str(tiny_model),
        "--port",
        str(_free_port()),
    ]
    serve = run_cli([*args, "--distributed-executor-backend", "ray"], timeout=120)
    assert serve.returncode == 2
    assert serve.stderr.decode().endswith(
        "Error: --distributed-executor-backend ray is for fd run-batch; fd serve runs its engines as "
        "processes on this machine (mp)\n"
    )
