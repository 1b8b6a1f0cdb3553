"""`fd serve -tp 2 --nnodes 2` on loopback: two "nodes" as two fd processes on the tiny Llama, node 0
the server with TP rank 0, node 1 only rank 1 (no HTTP server). Its greedy answers equal TP=1's (the
session's `server`); node 1 logs its ranks and exits when node 0 stops or dies; a node that never joins
fails node 0's start within the group timeout naming it; node 1 killed mid-stream fails the request."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from server.fd_server import REPO, start_server, stream_in_background, wait_for

# Not the other parallel tests' prompts: they share the session server's prefix cache.
PROMPTS = [f"multi-node prompt {i}: say {i * 7}" for i in range(3)]


def port_pair() -> int:
    """A port p with p and p + 1 free (the group's store and rank 0's step socket)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port >= 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two consecutive free ports")


def topology(port: int, rank: int, ips: bool = False) -> list[str]:
    nodes = ["--ips", "127.0.0.1,127.0.0.1"] if ips else ["--nnodes", "2", "--master-addr", "127.0.0.1"]
    return ["-tp", "2", *nodes, "--node-rank", str(rank), "--master-port", str(port)]


def start_node1(model: Path, tmp: Path, port: int, ips: bool = False) -> tuple[subprocess.Popen, Path]:
    log = tmp / "node1.log"
    cmd = [sys.executable, "-m", "fdcli.main", "serve", "--model", str(model), "--threads", "1"]
    cmd += ["--num-kv-blocks", "128", *topology(port, 1, ips)]
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=REPO)
    return proc, log


def start_node0(model: Path, tmp: Path, port: int, ips: bool = False, **kw):
    return start_server(
        model, tmp, "--served-model-name", "tiny", "--max-model-len", "256", *topology(port, 0, ips), **kw
    )


def complete(srv, prompt: str) -> dict:
    payload = {"model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 0}
    with srv.http() as c:
        r = c.post("/v1/completions", json=payload)
    return {"status": r.status_code, **r.json()}


def stop_node1(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


def test_two_nodes_answer_equal_tp1_and_node1_follows_node0(server, tiny_model, tmp_path):
    port = port_pair()
    node1, log1 = start_node1(tiny_model, tmp_path, port)
    try:
        srv = start_node0(tiny_model, tmp_path, port)
        try:
            with ThreadPoolExecutor(len(PROMPTS)) as pool:
                ref = list(pool.map(lambda p: complete(server, p), PROMPTS))
                got = list(pool.map(lambda p: complete(srv, p), PROMPTS))
            assert [r["status"] for r in got] == [200] * len(PROMPTS)
            assert [r["choices"][0]["text"] for r in got] == [r["choices"][0]["text"] for r in ref]
            first = log1.read_text().splitlines()
            assert f"node 1 of 2 serving tensor-parallel ranks [1] for 127.0.0.1:{port}" in "\n".join(first)
            assert node1.poll() is None
        finally:
            assert srv.stop() == 0, srv.log.read_text()[-3000:]
        assert node1.wait(30) == 0, log1.read_text()[-2000:]  # rank 0 stopped it: a clean exit
    finally:
        stop_node1(node1)


def test_node_that_never_joins_fails_node0_naming_it(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("FD_TP_GROUP_TIMEOUT", "5")
    srv = start_node0(tiny_model, tmp_path, port_pair(), wait_ready=False)
    try:
        code = srv.proc.wait(90)
    finally:
        srv.stop()
    log = srv.log.read_text()
    assert code != 0, log[-2000:]
    assert "tensor-parallel rank 1 (node 1) did not join the group" in log, log[-2000:]
    assert "within 5 s" in log, log[-2000:]


def test_node1_killed_mid_stream_fails_the_request(tiny_model, tmp_path):
    port = port_pair()
    node1, _ = start_node1(tiny_model, tmp_path, port, ips=True)
    srv = None
    try:
        srv = start_node0(tiny_model, tmp_path, port, ips=True)
        sink: list = []
        t = stream_in_background(srv, sink)
        wait_for(lambda: len(sink) > 2, 60, "the stream to start")
        node1.send_signal(signal.SIGKILL)  # its worker dies with it (PR_SET_PDEATHSIG)
        t.join(60)
        assert not t.is_alive(), "the stream hung after node 1 died"
        streamed = "\n".join(sink)
        assert "error" in streamed and "tensor-parallel" in streamed, streamed[-500:]
        assert '"finish_reason":"length"' not in streamed
        assert srv.proc.wait(30) != 0  # the engine is dead: the server says so and exits
    finally:
        if srv is not None:
            srv.stop()
        stop_node1(node1)


def test_node1_exits_when_node0_is_killed(tiny_model, tmp_path):
    port = port_pair()
    node1, log1 = start_node1(tiny_model, tmp_path, port)
    srv = None
    try:
        srv = start_node0(tiny_model, tmp_path, port)
        assert complete(srv, PROMPTS[0])["status"] == 200
        core = srv.core_process()
        srv.proc.kill()
        core.kill()  # rank 0 gone without a word: node 1 sees its connection drop
        assert node1.wait(30) != 0
        assert "rank 0 closed its connection" in log1.read_text(), log1.read_text()[-2000:]
    finally:
        if srv is not None:
            srv.stop()
        stop_node1(node1)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--nnodes", "2"], "--nnodes 2 needs --master-port"),
        (["--nnodes", "2", "--master-port", "29500", "-dp", "2", "-tp", "2"], "is not built yet"),
        (["--nnodes", "2", "--master-port", "29500", "-tp", "3"], "divide over 2 nodes"),
        (["--ips", "10.255.255.1,10.255.255.2", "--master-port", "29500"], "none is an address of this host"),
    ],
)
def test_bad_node_options_one_line(tiny_model, extra, message):
    tp = [] if "-tp" in extra else ["-tp", "2"]
    r = subprocess.run(
        [sys.executable, "-m", "fdcli.main", "serve", "--model", str(tiny_model), "--port", "1", *tp, *extra],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert message in lines[-1] and len(lines) == 1, r.stderr[-1000:]


def test_run_batch_refuses_a_worker_node(tiny_model, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("")
    cmd = [sys.executable, "-m", "fdcli.main", "run-batch", "--model", str(tiny_model), "-i", str(src)]
    cmd += ["-o", str(tmp_path / "out.jsonl"), *topology(29500, 1)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert "--node-rank 1 only serves its tensor-parallel ranks" in lines[-1] and len(lines) == 1, r.stderr


@pytest.mark.parametrize(
    "ips, node_rank, expected",
    [
        ("127.0.0.1,10.255.255.9", 0, (0, "127.0.0.1")),
        ("10.255.255.9,127.0.0.1", 0, (1, "10.255.255.9")),
        ("127.0.0.1,127.0.0.1", 1, (1, "127.0.0.1")),
    ],
)
def test_ips_pick_this_node_and_the_master(ips, node_rank, expected):
    from fdcli_engine.config import EngineConfig
    from fdcli_engine.parallel_config import node_ranks, resolve_nodes

    config = EngineConfig(tensor_parallel_size=4, ips=ips, node_rank=node_rank, master_port=29500)
    nodes = resolve_nodes(config)
    assert (nodes["node_rank"], nodes["master_addr"]) == expected and nodes["nnodes"] == 2
    assert node_ranks(config.replace(**nodes)) == [2 * expected[0], 2 * expected[0] + 1]


def test_step_port_in_use_fails_node0_in_one_line(tiny_model, tmp_path):
    port = port_pair()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port + 1))
        taken.listen()
        srv = start_node0(tiny_model, tmp_path, port, wait_ready=False)
        try:
            code = srv.proc.wait(90)
        finally:
            srv.stop()
    log = srv.log.read_text()
    assert code != 0 and f"cannot listen for other nodes at tcp://127.0.0.1:{port + 1}" in log, log[-2000:]
