"""A real `fd serve` started the FastDeploy way: its no-effect flags, --metrics-port and FD_LOG_DIR.

One server (the tiny Llama, with an API key) takes the flags of FastDeploy's ERNIE-4.5 pages that mean
nothing on CPU; each says so once in the log. Its --speculative-config (FastDeploy's ngram_match: the
tiny Llama has no MTP layer) is a real engine option: named on the start-up line, no "not built yet"
note. /metrics is scraped on both ports: the metrics port needs no key, the API port still does, and
both read the same counters.
"""

from __future__ import annotations

import socket
import subprocess
import sys

import httpx
import pytest
from fd_server import REPO, free_port, start_server

NOTES = {
    "--load-choices default_v1: fd has one weight loader": "--load_choices",
    "--use-cudagraph has no effect on CPU": "--use-cudagraph",
    "--gpu-memory-utilization has no effect on CPU": "--gpu-memory-utilization",
    "--kv-cache-ratio has no effect": "--kv-cache-ratio",
    "--engine-worker-queue-port has no effect": "--engine-worker-queue-port",
    "--cache-queue-port has no effect": "--cache-queue-port",
}
FLAGS = [
    "--load_choices",
    "default_v1",
    "--use-cudagraph",
    "--gpu-memory-utilization",
    "0.9",
    "--kv-cache-ratio",
    "0.75",
    "--engine-worker-queue-port",
    "8182",
    "--cache-queue-port",
    "8183",
    "--swap-space",
    "50",
    "--speculative-config",
    '{"method": "ngram_match", "num_speculative_tokens": 1}',
    "--splitwise-role",
    "mixed",
    "--data-parallel-size",
    "1",
]


@pytest.fixture(scope="module")
def launched(tiny_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fastdeploy-launch")
    metrics_port = free_port()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FD_LOG_DIR", str(tmp / "log"))
        srv = start_server(
            tiny_model, tmp, "--served-model-name", "tiny", "--metrics-port", str(metrics_port), *FLAGS
        )
    srv.metrics_port = metrics_port
    srv.log_dir = tmp / "log"
    yield srv
    assert srv.stop() == 0, srv.log.read_text()[-3000:]


def _scrape(url: str, **kw) -> dict[str, float]:
    r = httpx.get(url, timeout=10, **kw)
    assert r.status_code == 200, r.text
    values = {}
    for line in r.text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def test_metrics_on_both_ports(launched):
    client = launched.client()
    out = client.completions.create(model="tiny", prompt="hello world", max_tokens=5, temperature=0)
    assert out.usage.completion_tokens == 5
    side = f"http://127.0.0.1:{launched.metrics_port}"
    main = f"{launched.url}/metrics"
    assert httpx.get(main, timeout=10).status_code == 401  # the API port keeps its key
    on_main = _scrape(main, headers=launched.headers)
    on_side = _scrape(f"{side}/metrics")  # no key
    assert on_side["fd:generation_tokens_total"] == on_main["fd:generation_tokens_total"] >= 5
    assert on_side["fd:prompt_tokens_total"] == on_main["fd:prompt_tokens_total"] > 0
    # speculation is on: its counters are exported (the engine's stats carry them), the same on both
    for name in ("fd:spec_decode_num_draft_tokens_total", "fd:spec_decode_num_accepted_tokens_total"):
        assert on_side[name] == on_main[name] >= 0
    assert (
        on_main["fd:spec_decode_num_accepted_tokens_total"]
        <= on_main["fd:spec_decode_num_draft_tokens_total"]
    )
    assert 'fd:spec_decode_num_accepted_tokens_per_pos_total{position="0"}' in on_main
    assert httpx.get(f"{side}/v1/models", timeout=10).status_code == 404  # /metrics alone
    # --swap-space 50 runs the memory tier: its metrics are exported (docs/kv-offload.md)
    for name in (
        "fd:prefix_cpu_cache_token_num",
        "fd:cpu_hit_token_rate",
        'fd:kv_offload_total_bytes_total{transfer_type="KV_to_CPU"}',
        'fd:kv_offload_total_time_total{transfer_type="CPU_to_KV"}',
    ):
        assert on_main[name] >= 0, name


def test_each_flag_without_effect_is_one_log_line(launched):
    log = launched.log.read_text()
    for note in NOTES:
        assert log.count(note) == 1, (note, log[-3000:])
    assert "--splitwise-role" not in log and "--data-parallel-size" not in log  # no-op values: silent
    assert "not built yet" not in log  # --swap-space and speculative decoding are built


def test_start_up_line_names_the_speculative_method(launched):
    (line,) = [x for x in launched.log.read_text().splitlines() if x.endswith("— engine loading")]
    assert line.startswith("fd serve: tiny (") and f"on {launched.url}, " in line, line
    assert "speculative decoding: ngram, 1 token(s) per step, prompt lookup 2-5 — engine loading" in line


def test_fd_log_dir_holds_the_server_and_engine_logs(launched):
    server_log = (launched.log_dir / "api_server.log").read_text()
    core_log = (launched.log_dir / "workerlog.0").read_text()
    assert all(note in server_log for note in NOTES)
    assert "engine ready; try  curl" in server_log and f":{launched.metrics_port}/metrics" in server_log
    assert "engine ready in" in core_log and "fd-core INFO" in core_log
    assert "engine ready in" not in server_log  # each process writes its own file
    stderr = launched.log.read_text()  # everything is on stderr as well
    assert "engine ready in" in stderr and "engine ready; try  curl" in stderr
    assert sorted(p.name for p in launched.log_dir.iterdir()) == ["api_server.log", "workerlog.0"]


def test_busy_metrics_port_is_one_line_before_the_model_loads(tiny_model, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        cmd = [sys.executable, "-m", "fdcli.main", "serve", "--model", str(tiny_model)]
        cmd += ["--port", str(free_port()), "--metrics-port", str(port)]
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stderr == f"Error: 127.0.0.1:{port} is already in use; pick another --metrics-port\n"
