"""`fd bench serve` / `compare` through the CLI: a full run against a scripted server, the saved JSON,
and the error paths (one line on stderr, non-zero exit, never a traceback)."""

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.append(str(Path(__file__).resolve().parents[1] / "bench"))  # for bench_support

from bench_support import free_port, running_server, train_bpe  # noqa: E402

from fdcli.commands.bench import app  # noqa: E402

runner = CliRunner()

TOP_KEYS = ["schema", "kind", "date", "fd_version", "config", "metrics", "requests"]
METRIC_KEYS = {
    "num_requests", "completed", "failed", "duration_s", "total_input_tokens", "total_output_tokens",
    "request_throughput", "output_throughput", "total_token_throughput", "peak_output_throughput",
    "itl_mode", "output_tokens_source", "good_requests", "goodput", "goodput_slo_ms", "ttft", "tpot",
    "itl", "e2el", "errors", "throughput_series", "interrupted",
}  # fmt: skip


@pytest.fixture
def scripted_server():
    with running_server() as state:
        yield state


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory):
    tok = train_bpe()
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return str(path)


def _custom(tmp_path, prompts) -> str:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "output_tokens": 3}) + "\n" for p in prompts))
    return str(path)


def test_full_run_prints_summary_and_saves_stable_json(scripted_server, tmp_path, tokenizer_json):
    out = tmp_path / "r.json"
    args = ["serve", "--base-url", scripted_server.url + "/v1", "--tokenizer", tokenizer_json,
            "--dataset-name", "random", "--random-input-len", "12", "--random-output-len", "3",
            "--num-prompts", "4", "--max-concurrency", "2", "--header", "X-Secret=hunter2",
            "--api-key", "sk-topsecret", "--goodput", "ttft:5000 tpot:5000", "--percentiles", "50,99",
            "--save-result", str(out), "--save-detailed", "--no-progress"]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "Successful requests" in res.stdout and "Inter-token latency (per token)" in res.stdout
    assert "TTFT distribution" in res.stdout and "Output throughput over time" in res.stdout
    text = out.read_text()
    assert "hunter2" not in text and "sk-topsecret" not in text and "hunter2" not in res.output
    data = json.loads(text)
    assert list(data)[: len(TOP_KEYS)] == TOP_KEYS  # fd's layout first; vLLM's flat keys follow
    assert data["schema"] == "fd-bench/1" and data["kind"] == "serve"
    assert set(data["metrics"]) == METRIC_KEYS
    assert set(data["metrics"]["ttft"]) == {"mean_ms", "median_ms", "std_ms", "p50_ms", "p99_ms"}
    m = data["metrics"]
    assert (m["completed"], m["failed"], m["good_requests"]) == (4, 0, 4)
    assert m["total_output_tokens"] == 12 and m["total_input_tokens"] == 4 * 7  # the server's usage
    cfg = data["config"]
    assert cfg["model"] == "scripted-model" and cfg["base_url"] == scripted_server.url
    assert cfg["endpoint"] == "/v1/completions" and cfg["request_rate"] == "inf"
    assert cfg["header"] == {"X-Secret": "<redacted>"} and cfg["api_key"] == "<redacted>"
    assert cfg["goodput"] == {"ttft": 5000.0, "tpot": 5000.0}
    assert len(data["requests"]) == 4 and all(r["ok"] for r in data["requests"])
    # The prompts the server got re-tokenize to exactly 12 tokens, and the key reached it as a bearer.
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_json)
    assert {len(tok.encode(b["prompt"]).ids) for b in scripted_server.payloads} == {12}
    assert scripted_server.peak_in_flight <= 2
    assert set(scripted_server.auth) == {"Bearer sk-topsecret"}


def test_failures_are_shown_and_counted(scripted_server, tmp_path):
    path = _custom(tmp_path, ["ok", "fail", "ok", "malformed"])
    args = ["serve", "--base-url", scripted_server.url, "--dataset", "custom", "--skip-chat-template", "--dataset-path", path,
            "--num-prompts", "4", "--seed", "0", "--num-warmups", "0", "--no-progress", "--no-chart",
            "--max-tokens", "2", "--no-include-usage"]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "2 request(s) failed" in res.stdout
    assert "HTTP 500" in res.stdout and "malformed stream" in res.stdout
    assert {b["max_tokens"] for b in scripted_server.payloads} == {2}  # --max-tokens overrides the file's 3
    assert not any("stream_options" in b for b in scripted_server.payloads)


def test_base_url_follows_the_client_url_rule(tmp_path):
    """--base-url without a scheme is http:// (as fd chat/complete --url); another scheme is one line."""
    port = free_port()
    res = runner.invoke(
        app, ["serve", "--base-url", f"127.0.0.1:{port}", "--ready-timeout", "0", "--no-progress"]
    )
    assert res.exit_code == 1 and res.stderr.startswith(f"Error: server at http://127.0.0.1:{port} not ready")
    res = runner.invoke(app, ["serve", "--base-url", "ftp://h:1", "--no-progress"])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and "use an http://" in res.stderr


def test_unreachable_server_is_one_line_and_nonzero(tmp_path):
    res = runner.invoke(app, ["serve", "--port", str(free_port()), "--ready-timeout", "0", "--no-progress"])
    assert res.exit_code == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: server at http://127.0.0.1:")
    assert "Traceback" not in res.output


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--goodput", "ttft=100"], "--goodput"),
        (["--percentiles", "50,x"], "--percentiles"),
        (["--backend", "grpc"], "--backend"),
        (["--header", "novalue"], "KEY=VALUE"),
        (["--request-rate", "0"], "--request-rate"),
        (["--save-detailed"], "--save-result"),
        (["--result-dir", "x"], "--save-result"),
        (["--metadata", "novalue"], "KEY=VALUE"),
        (["--percentile-metrics", "ttft,latency"], "--percentile-metrics"),
        (["--max-tokens", "0"], "--max-tokens"),
    ],
)
def test_bad_options_fail_before_any_network_call(extra, message):
    # Nothing listens on the port and the ready timeout is long: reaching the network would hang.
    res = runner.invoke(app, ["serve", "--port", str(free_port()), "--ready-timeout", "600", *extra])
    assert res.exit_code == 2
    assert res.stderr.count("\n") == 1 and message in res.stderr


def test_unknown_model_name_lists_fails_per_request_not_the_run(scripted_server, tmp_path):
    # A dataset error after the server is ready is still one line (exit 2).
    res = runner.invoke(
        app, ["serve", "--base-url", scripted_server.url, "--dataset", "custom", "--no-progress"]
    )
    assert res.exit_code == 2 and "--dataset-path" in res.stderr


def _result(tmp_path, name, ttft, tput):
    metrics = {"completed": 10, "output_throughput": tput, "ttft": {"mean_ms": ttft}, "itl_mode": "token"}
    path = tmp_path / name
    path.write_text(json.dumps({"schema": "fd-bench/1", "kind": "serve", "metrics": metrics}))
    return str(path)


def test_compare_prints_runs_side_by_side_with_ratios(tmp_path):
    a = _result(tmp_path, "a.json", 100.0, 50.0)
    b = _result(tmp_path, "b.json", 250.0, 25.0)
    res = runner.invoke(app, ["compare", a, b], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    lines = {ln.split("│")[1].strip(): ln for ln in res.stdout.splitlines() if ln.count("│") >= 3}
    assert "2.50×" in lines["ttft.mean_ms"] and "0.50×" in lines["output_throughput"]
    assert "1.00×" in lines["completed"] and "itl_mode" not in lines


def test_compare_reads_every_run_of_an_appended_file(tmp_path):
    from fdcli.bench.results import build_result, save_result

    path = tmp_path / "app.json"
    for ttft in (100.0, 300.0):
        save_result(path, build_result("serve", {}, {"completed": 4, "ttft": {"mean_ms": ttft}}), append=True)
    res = runner.invoke(app, ["compare", str(path)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "app.json#1" in res.stdout and "app.json#2" in res.stdout
    lines = {ln.split("│")[1].strip(): ln for ln in res.stdout.splitlines() if ln.count("│") >= 3}
    assert "3.00×" in lines["ttft.mean_ms"]


def test_compare_reads_vllm_bench_serve_files_beside_fds(tmp_path):
    # The flat keys `vllm bench serve --save-result` writes (vllm/benchmarks/serve.py), no `metrics`.
    vllm = {"date": "20261207-120000", "backend": "vllm", "completed": 10, "failed": 0, "duration": 2.0,
            "request_throughput": 5.0, "output_throughput": 25.0, "mean_ttft_ms": 250.0,
            "p99.9_ttft_ms": 400.0, "max_output_tokens_per_s": 40.0}  # fmt: skip
    (tmp_path / "vllm.json").write_text(json.dumps(vllm))
    fd = _result(tmp_path, "fd.json", 100.0, 50.0)
    res = runner.invoke(app, ["compare", fd, str(tmp_path / "vllm.json")], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    lines = {ln.split("│")[1].strip(): ln for ln in res.stdout.splitlines() if ln.count("│") >= 3}
    assert "2.50×" in lines["ttft.mean_ms"] and "0.50×" in lines["output_throughput"]
    assert "400" in lines["ttft.p99_9_ms"] and "40" in lines["peak_output_throughput"]


def test_compare_reads_vllm_latency_and_throughput_files(tmp_path):
    lat = {"avg_latency": 0.5, "std_latency": 0.1, "latencies": [0.4, 0.6], "percentiles": {"50": 0.5}}
    (tmp_path / "a.json").write_text(json.dumps(lat))
    (tmp_path / "b.json").write_text(json.dumps({**lat, "avg_latency": 1.0}))
    res = runner.invoke(
        app, ["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")], env={"COLUMNS": "200"}
    )
    assert res.exit_code == 0, res.output
    lines = {ln.split("│")[1].strip(): ln for ln in res.stdout.splitlines() if ln.count("│") >= 3}
    assert (
        "500" in lines["latency.mean_ms"]
        and "2.00×" in lines["latency.mean_ms"]
        and "latency.p50_ms" in lines
    )
    tput = {"elapsed_time": 2.0, "num_requests": 8, "total_num_tokens": 100, "requests_per_second": 4.0,
            "tokens_per_second": 50.0}  # fmt: skip
    (tmp_path / "t.json").write_text(json.dumps(tput))
    res = runner.invoke(app, ["compare", str(tmp_path / "t.json"), str(tmp_path / "a.json")])
    assert res.exit_code == 2 and "different kinds" in res.stderr


@pytest.mark.parametrize("content", [None, "not json", '{"kind": "serve"}', '{"a": 1}\nnot json\n'])
def test_compare_bad_inputs(tmp_path, content):
    a = _result(tmp_path, "a.json", 1.0, 1.0)
    args = ["compare", a]
    if content is not None:
        (tmp_path / "bad.json").write_text(content)
        args.append(str(tmp_path / "bad.json"))
    res = runner.invoke(app, args)
    assert res.exit_code == 2 and res.stderr.startswith("Error: ") and res.stderr.count("\n") == 1


def test_ctrl_c_prints_the_partial_summary(monkeypatch, scripted_server, tmp_path):
    from fdcli.bench import serve_cmd
    from fdcli.bench.metrics import RequestRecord

    async def interrupted(cfg, requests, traffic, state, tokenizer=None, on_done=None):
        state.bench_start = 100.0
        state.records.append(
            RequestRecord(
                0,
                ok=True,
                output_tokens=2,
                start=100.0,
                end=100.5,
                chunk_times=[100.2, 100.4],
                chunk_tokens=[1, 1],
                prompt_len=3,
            )  # fmt: skip
        )
        raise KeyboardInterrupt

    monkeypatch.setattr(serve_cmd, "run_benchmark", interrupted)
    path = _custom(tmp_path, ["ok"])
    out = tmp_path / "partial.json"
    args = ["serve", "--base-url", scripted_server.url, "--dataset", "custom", "--skip-chat-template", "--dataset-path", path,
            "--num-prompts", "3", "--no-progress", "--save-result", str(out)]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 130
    assert "Interrupted: partial results" in res.stdout
    data = json.loads(out.read_text())
    assert data["metrics"]["interrupted"] is True and data["metrics"]["completed"] == 1
    assert data["metrics"]["ttft"]["mean_ms"] == pytest.approx(200.0)


def test_ramp_up_and_rate_reach_the_arrival_schedule(monkeypatch, scripted_server, tmp_path):
    from fdcli.bench import serve_cmd
    from fdcli.bench.traffic import arrival_offsets

    seen = {}

    async def capture(cfg, requests, traffic, state, tokenizer=None, on_done=None):
        seen["offsets"] = traffic.offsets
        state.bench_start = state.bench_end = 0.0

    monkeypatch.setattr(serve_cmd, "run_benchmark", capture)
    path = _custom(tmp_path, ["ok"])
    base = ["serve", "--base-url", scripted_server.url, "--dataset", "custom", "--skip-chat-template", "--dataset-path", path,
            "--num-prompts", "20", "--seed", "4", "--no-progress"]  # fmt: skip
    ramp = ["--ramp-up", "exponential", "--ramp-up-start-rate", "1", "--ramp-up-end-rate", "50"]
    assert runner.invoke(app, base + ramp).exit_code == 0
    assert seen["offsets"] == arrival_offsets(20, float("inf"), 1.0, 4, "exponential", 1.0, 50.0)
    assert runner.invoke(app, base + ["--request-rate", "7", "--burstiness", "0.5"]).exit_code == 0
    assert seen["offsets"] == arrival_offsets(20, 7.0, 0.5, 4)


def test_bench_is_mounted_on_the_fd_app():
    from fdcli.main import app as fd_app

    res = runner.invoke(fd_app, ["bench", "--help"])
    assert res.exit_code == 0 and "serve" in res.stdout and "compare" in res.stdout


def test_help_keeps_bracketed_text():
    # Rich reads "[...]" as markup and would drop the range from --random-range-ratio's help.
    result = runner.invoke(app, ["serve", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "[len·(1-r), len·(1+r)]" in result.output
