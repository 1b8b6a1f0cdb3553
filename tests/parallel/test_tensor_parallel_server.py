"""`fd serve -tp 2` and `fd run-batch --tensor-parallel-size 2` on the tiny Llama (one thread per rank):
the same answers as TP=1 (the session's `server`, a TP=1 run-batch), each rank on its own CPU, a killed
worker failing the in-flight request and the engine, and SmolLM2's heads refused at start."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest
from batch.batch_helpers import cli_args, completion_line, read_jsonl, run_cli, write_jsonl
from server.fd_server import REPO, start_server, stream_in_background, wait_for

# Not the data-parallel tests' prompts: both use the session server, whose prefix cache they would share.
PROMPTS = [f"tensor-parallel prompt {i}: count to {i * 3}" for i in range(4)]
WORKER = "fdcli_engine.runner.tp_worker"


def complete(srv, prompt: str, **body) -> dict:
    payload = {"model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 0, **body}
    with srv.http() as c:
        r = c.post("/v1/completions", json=payload)
    return {"status": r.status_code, **r.json()}


def workers_of(srv) -> list[psutil.Process]:
    return [
        p for p in psutil.Process(srv.proc.pid).children(recursive=True) if WORKER in " ".join(p.cmdline())
    ]


@pytest.fixture(scope="module")
def tp_server(tiny_model, tmp_path_factory):
    srv = start_server(tiny_model, tmp_path_factory.mktemp("tp"), "--served-model-name", "tiny", "-tp", "2")
    workers = workers_of(srv)
    yield srv
    assert srv.stop() == 0, srv.log.read_text()[-3000:]  # a clean shutdown, its worker included
    assert all(not w.is_running() or w.status() == psutil.STATUS_ZOMBIE for w in workers)


def test_tp2_server_answers_equal_tp1(server, tp_server):
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        ref = list(pool.map(lambda p: complete(server, p), PROMPTS))
        got = list(pool.map(lambda p: complete(tp_server, p), PROMPTS))
    assert [r["status"] for r in got] == [200] * len(PROMPTS)
    assert [r["choices"][0]["text"] for r in got] == [r["choices"][0]["text"] for r in ref]


def test_each_tp_rank_on_its_own_cpu(tp_server):
    core = tp_server.core_process()
    (worker,) = workers_of(tp_server)
    assert worker.ppid() == core.pid
    sets = [os.sched_getaffinity(core.pid), os.sched_getaffinity(worker.pid)]
    assert all(sets) and sets[0].isdisjoint(sets[1])


def test_run_batch_tp2_equals_tp1(tiny_model, tmp_path):
    lines = [completion_line(f"c{i}", p, max_tokens=10) for i, p in enumerate(PROMPTS)]
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    outs = []
    for name, extra in (("tp1", ()), ("tp2", ("--tensor-parallel-size", "2"))):
        out = tmp_path / f"{name}.jsonl"
        r = run_cli(cli_args(tiny_model, "-i", str(src), "-o", str(out), *extra))
        assert r.returncode == 0, r.stderr.decode()[-2000:]
        outs.append({x["custom_id"]: x["response"]["body"]["choices"][0]["text"] for x in read_jsonl(out)})
    assert outs[1] == outs[0] and len(outs[0]) == len(PROMPTS)


def test_killed_worker_fails_the_request_and_the_engine(tiny_model, tmp_path):
    srv = start_server(
        tiny_model, tmp_path, "--served-model-name", "tiny", "-tp", "2", "--max-model-len", "256"
    )
    try:
        sink: list = []
        t = stream_in_background(srv, sink)
        wait_for(lambda: len(sink) > 2, 30, "the stream to start")
        (worker,) = workers_of(srv)
        worker.kill()
        t.join(30)
        assert not t.is_alive(), "the stream hung after its worker died"
        streamed = "\n".join(sink)
        assert "error" in streamed and "tensor-parallel rank 1" in streamed, streamed[-500:]
        assert "[DONE]" not in streamed or '"finish_reason":"length"' not in streamed
        assert srv.proc.wait(30) != 0  # the engine is dead: the server says so and exits
        assert "tensor-parallel rank 1" in srv.log.read_text()
    finally:
        srv.stop()


def test_smollm2_heads_refused_at_start():
    from fdcli_engine.config import default_model_path

    try:
        default_model_path()
    except Exception:
        pytest.skip("SmolLM2 (the default model) is not installed")
    r = subprocess.run(
        [sys.executable, "-m", "fdcli.main", "serve", "-tp", "2", "--port", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert lines[-1].endswith("3 KV heads do not divide by tensor-parallel size 2"), r.stderr[-1000:]
    assert len(lines) == 1, r.stderr[-1000:]
