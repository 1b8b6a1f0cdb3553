"""`--data-parallel-size 2`: two engine-core processes under one front end (tiny Llama, one thread each).

References: the session's DP=1 server (tests/conftest.py `server`) for outputs; the cached-token counts
for prefix affinity (a rank that never saw a prefix has nothing cached); the processes themselves for a
rank's death.
"""

from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from batch.batch_helpers import chat_line, cli_args, completion_line, read_jsonl, run_cli, write_jsonl
from server.fd_server import start_server

PROMPTS = [f"request {i}: tell me about the number {i * 7}" for i in range(6)]
LONG_PREFIX = " ".join(f"word{i}" for i in range(40))  # well over four 16-token blocks


@pytest.fixture(scope="module")
def dp_server(tiny_model, tmp_path_factory):
    srv = start_server(
        tiny_model, tmp_path_factory.mktemp("dp"), "--served-model-name", "tiny", "--data-parallel-size", "2"
    )
    yield srv
    srv.stop()


def complete(srv, prompt: str, **body) -> dict:
    payload = {"model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 0, **body}
    with srv.http() as c:
        r = c.post("/v1/completions", json=payload)
    return {"status": r.status_code, **r.json()}


def concurrently(srv, prompts, **body) -> list[dict]:
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda p: complete(srv, p, **body), prompts))


def rank_pids(srv) -> dict[int, int]:
    """Engine-core process of each data-parallel rank (from the config on its command line)."""
    import psutil

    out = {}
    for child in psutil.Process(srv.proc.pid).children():
        cmd = child.cmdline()
        if "fdcli_engine.api.core_proc" in cmd:
            config = json.loads(cmd[cmd.index("--config") + 1])
            out[config["data_parallel_rank"]] = child.pid
    return out


def test_dp2_outputs_equal_dp1_request_by_request(server, dp_server):
    ref = concurrently(server, PROMPTS)
    got = concurrently(dp_server, PROMPTS)
    assert [r["status"] for r in got] == [200] * len(PROMPTS)
    assert [r["choices"][0]["text"] for r in got] == [r["choices"][0]["text"] for r in ref]
    assert [r["usage"] for r in got] == [r["usage"] for r in ref]


def test_each_rank_pinned_to_its_own_cpu(dp_server):
    pids = rank_pids(dp_server)
    assert sorted(pids) == [0, 1]
    allowed = sorted(os.sched_getaffinity(0))
    sets = [os.sched_getaffinity(pids[r]) for r in (0, 1)]
    assert sets[0].isdisjoint(sets[1]) and all(sets)
    assert sorted(sets[0] | sets[1]) == allowed[: len(sets[0] | sets[1])]


def cached(resp: dict) -> int:
    return (resp["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)


def test_repeated_prefix_goes_to_the_rank_that_holds_it(dp_server):
    """Rank 0 is frozen (SIGSTOP) holding one request while the prefix is first sent, so load alone
    sends it to rank 1; once both are idle, load alone would pick rank 0 (ties go low), where nothing
    is cached. Only prefix affinity sends the repeat to rank 1, where its blocks are cached."""
    rank0 = rank_pids(dp_server)[0]
    os.kill(rank0, signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(1) as pool:
            busy = pool.submit(complete, dp_server, "keep rank zero busy")
            time.sleep(0.5)  # the busy request reaches the front end and is routed (to rank 0)
            first = complete(dp_server, LONG_PREFIX + " first question", max_tokens=2)
            os.kill(rank0, signal.SIGCONT)
            assert busy.result()["status"] == 200
    finally:
        os.kill(rank0, signal.SIGCONT)
    assert first["status"] == 200 and cached(first) == 0
    again = complete(dp_server, LONG_PREFIX + " second question", max_tokens=2)
    assert cached(again) >= 64, again["usage"]


def test_metrics_label_gauges_by_rank(dp_server):
    m = dp_server.metrics()
    for rank in ("0", "1"):
        assert f'fd:num_requests_running{{rank="{rank}"}}' in m
        assert m[f'fd:data_parallel_rank_alive{{rank="{rank}"}}'] == 1.0
    assert "fd:generation_tokens_total" in m  # counters stay single sums


def test_vllm_names_label_each_engine(dp_server):
    """vLLM's engine families carry engine="N" per data-parallel rank (vLLM's labels), and their
    counters sum to fd's merged counter."""
    complete(dp_server, "vllm names over two ranks")
    m = dp_server.metrics()
    for rank in ("0", "1"):
        assert f'vllm:num_requests_running{{engine="{rank}",model_name="tiny"}}' in m
    per_engine = [m[f'vllm:generation_tokens_total{{engine="{r}",model_name="tiny"}}'] for r in ("0", "1")]
    assert sum(per_engine) == m["fd:generation_tokens_total"] > 0
    # Each rank's tokens per step add up to its own prompt and generated tokens.
    for r in ("0", "1"):
        labels = f'{{engine="{r}",model_name="tiny"}}'
        tokens = m[f"vllm:prompt_tokens_total{labels}"] + m[f"vllm:generation_tokens_total{labels}"]
        assert m[f"vllm:iteration_tokens_total_sum{labels}"] == tokens


def test_killing_one_rank_fails_only_its_requests(tiny_model, tmp_path, monkeypatch):
    cpus = sorted(os.sched_getaffinity(0))
    monkeypatch.setenv("FD_CPU_OMP_THREADS_BIND", f"{cpus[0]}|{cpus[1]}")  # vLLM's per-rank form
    srv = start_server(tiny_model, tmp_path, "--served-model-name", "tiny", "--data-parallel-size", "2")
    try:
        pids = rank_pids(srv)
        assert [os.sched_getaffinity(pids[r]) for r in (0, 1)] == [{cpus[0]}, {cpus[1]}]
        # Both cores frozen, so both requests are still in them when rank 1 is killed: one goes to each
        # rank (the second finds rank 0 loaded), then rank 0 resumes and must finish its own.
        for pid in pids.values():
            os.kill(pid, signal.SIGSTOP)
        try:
            with ThreadPoolExecutor(2) as pool:
                futs = [pool.submit(complete, srv, p, max_tokens=50) for p in PROMPTS[:2]]
                time.sleep(1.0)  # both reach the front end and are routed
                os.kill(pids[1], signal.SIGKILL)
                os.kill(pids[0], signal.SIGCONT)
                results = [f.result() for f in futs]
        finally:
            os.kill(pids[0], signal.SIGCONT)
        assert sorted(r["status"] for r in results) == [200, 503], results
        failed = next(r for r in results if r["status"] == 503)
        assert "rank 1" in failed["error"]["message"]
        health = httpx.get(f"{srv.url}/health", timeout=10)
        assert health.status_code == 200
        assert [d["rank"] for d in health.json()["dead_ranks"]] == [1]
        after = concurrently(srv, PROMPTS[:3])  # the live rank takes everything now
        assert [r["status"] for r in after] == [200, 200, 200]
        assert srv.metrics()['fd:data_parallel_rank_alive{rank="1"}'] == 0.0
    finally:
        srv.stop()


def test_run_batch_dp2_output_equals_dp1(tiny_model, tmp_path):
    lines = [completion_line(f"c{i}", p) for i, p in enumerate(PROMPTS)]
    lines += [chat_line(f"h{i}", p) for i, p in enumerate(PROMPTS[:3])]
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    outs = {}
    for dp in ("1", "2"):
        out = tmp_path / f"out{dp}.jsonl"
        proc = run_cli(cli_args(tiny_model, "-i", str(src), "-o", str(out), "--data-parallel-size", dp))
        assert proc.returncode == 0, proc.stderr.decode()[-2000:]
        outs[dp] = [(r["custom_id"], r["response"]["body"]["choices"]) for r in read_jsonl(out)]
    assert outs["2"] == outs["1"]
