"""`fd bench serve` with vLLM's spellings: `--save-result` as a flag with --result-dir/--result-filename,
--metric-percentiles, --percentile-metrics, multi-value --goodput/--metadata/--header, --label, and a
result file that vLLM's own scripts read (its keys, copied below from vLLM's benchmarks/serve.py)."""

import json
import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.append(str(Path(__file__).resolve().parents[1] / "bench"))  # for bench_support

from bench_support import running_server  # noqa: E402

from fdcli.bench.vllm_argv import rewrite_vllm_args  # noqa: E402
from fdcli.commands.bench import app  # noqa: E402

runner = CliRunner()

# The keys `vllm bench serve --save-result --save-detailed` writes for a generation backend with the
# default --metric-percentiles 99 and --percentile-metrics ttft,tpot,itl (+ e2el when selected), and
# a --goodput: vllm/benchmarks/serve.py, main_async() and benchmark().
VLLM_RESULT_KEYS = {
    "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts",
    "request_rate", "burstiness", "max_concurrency",
    "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
    "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
    "input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors",
    "max_output_tokens_per_s", "max_concurrent_requests",
    "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms",
    "mean_tpot_ms", "median_tpot_ms", "std_tpot_ms", "p99_tpot_ms",
    "mean_itl_ms", "median_itl_ms", "std_itl_ms", "p99_itl_ms",
    "mean_e2el_ms", "median_e2el_ms", "std_e2el_ms", "p99_e2el_ms",
}  # fmt: skip
PER_REQUEST = {"input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors"}


@pytest.fixture
def scripted_server():
    with running_server() as state:
        yield state


def _custom(tmp_path, prompts) -> str:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "output_tokens": 3}) + "\n" for p in prompts))
    return str(path)


def _base(server, tmp_path, n=4):
    return ["serve", "--base-url", server.url, "--dataset", "custom", "--skip-chat-template",
            "--dataset-path", _custom(tmp_path, ["ok"] * n), "--num-prompts", str(n),
            "--num-warmups", "0", "--no-progress", "--no-chart"]  # fmt: skip


def test_rewrite_reads_multi_value_options_and_the_old_save_result_path():
    assert rewrite_vllm_args(["--goodput", "ttft:300", "tpot:50", "--num-prompts", "4"]) == [
        "--goodput", "ttft:300", "--goodput", "tpot:50", "--num-prompts", "4",
    ]  # fmt: skip
    assert rewrite_vllm_args(["--metadata=a=1", "b=2", "--header", "X=1"]) == [
        "--metadata=a=1", "--metadata", "b=2", "--header", "X=1",
    ]  # fmt: skip
    assert rewrite_vllm_args(["--save-result"]) == ["--save-result"]
    assert rewrite_vllm_args(["--save-result", "--label", "x"]) == ["--save-result", "--label", "x"]
    assert rewrite_vllm_args(["--save-result", "r.json", "--seed", "1"]) == [
        "--save-result", "--result-filename", "r.json", "--seed", "1",
    ]  # fmt: skip
    assert rewrite_vllm_args(["--save-result=r.json"]) == ["--save-result", "--result-filename", "r.json"]
    # A bare word after an ordinary option is that option's value, never a repeat.
    assert rewrite_vllm_args(["--goodput", "ttft:1", "--label", "l", "x"]) == [
        "--goodput", "ttft:1", "--label", "l", "x",
    ]  # fmt: skip


def test_vllm_spelling_writes_vllms_keys_and_file_name(scripted_server, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out_dir = tmp_path / "results" / "nested"
    args = _base(scripted_server, tmp_path) + [
        "--max-concurrency", "2", "--save-result", "--save-detailed", "--result-dir", str(out_dir),
        "--label", "mylabel", "--metadata", "tp=1", "version=0.3.3",
        "--goodput", "ttft:5000", "tpot:5000", "--metric-percentiles", "50,90,99",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--header", "X-A=1", "X-B=2",
    ]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    files = list(out_dir.iterdir())
    assert len(files) == 1
    assert re.fullmatch(r"mylabel-infqps-concurrency2-scripted-model-\d{8}-\d{6}\.json", files[0].name)
    data = json.loads(files[0].read_text())
    assert VLLM_RESULT_KEYS <= set(data), VLLM_RESULT_KEYS - set(data)
    assert data["date"] in files[0].name and re.fullmatch(r"\d{8}-\d{6}", data["date"])
    assert (data["backend"], data["label"], data["model_id"]) == ("openai", "mylabel", "scripted-model")
    assert (data["tp"], data["version"]) == ("1", "0.3.3")
    assert data["request_rate"] == "inf" and data["max_concurrency"] == 2 and data["num_prompts"] == 4
    assert data["completed"] == 4 and data["failed"] == 0
    assert data["request_goodput"] == pytest.approx(4 / data["duration"])
    m = data["metrics"]  # fd's own summaries are the same numbers under vLLM's names
    for name in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std", "p50", "p90", "p99"):
            assert data[f"{stat}_{name}_ms"] == pytest.approx(m[name][f"{stat}_ms"])
    # Per-request lists in vLLM's units: seconds; 3 tokens in 3 chunks give 2 ITLs per request.
    assert data["output_lens"] == [3] * 4 and data["input_lens"] == [7] * 4
    assert [len(itl) for itl in data["itls"]] == [2] * 4 and data["errors"] == [""] * 4
    ttft_ms = sorted(t * 1000 for t in data["ttfts"])
    assert data["median_ttft_ms"] == pytest.approx((ttft_ms[1] + ttft_ms[2]) / 2)
    assert {p.get("max_tokens") for p in scripted_server.payloads} == {3}


def test_percentile_metrics_select_what_is_saved_and_shown(scripted_server, tmp_path):
    args = _base(scripted_server, tmp_path, n=2) + [
        "--save-result", "--result-dir", str(tmp_path), "--result-filename", "r.json",
        "--percentile-metrics", "e2el", "--metric-percentiles", "99.9",
    ]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "r.json").read_text())
    assert "p99.9_e2el_ms" in data and "mean_ttft_ms" not in data and "p99.9_ttft_ms" not in data
    assert not PER_REQUEST & set(data)  # without --save-detailed, as vLLM
    assert "End-to-end latency" in res.stdout and "Time to first token" not in res.stdout


def test_old_save_result_path_still_writes_that_file(scripted_server, tmp_path):
    out = tmp_path / "old.json"
    res = runner.invoke(app, _base(scripted_server, tmp_path, n=1) + ["--save-result", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["completed"] == 1


def test_max_concurrent_requests_counts_per_whole_second_as_vllm():
    from fdcli.bench.metrics import RequestRecord
    from fdcli.bench.vllm_result import max_concurrent_requests

    recs = [
        RequestRecord(0, ok=True, start=10.0, end=10.4),  # second 0
        RequestRecord(1, ok=True, start=10.5, end=11.2),  # seconds 0 and 1
        RequestRecord(2, ok=True, start=11.5, end=11.9),  # second 1
        RequestRecord(3, ok=True, start=11.6, end=13.0),  # seconds 1, 2, 3
        RequestRecord(4, ok=False, start=11.0, end=11.1),  # failed requests do not count
    ]
    assert max_concurrent_requests(recs) == 3
    assert max_concurrent_requests([]) == 0


def test_vllm_ramp_up_spelling_reaches_the_arrival_schedule(monkeypatch, scripted_server, tmp_path):
    from fdcli.bench import serve_cmd
    from fdcli.bench.traffic import arrival_offsets

    seen = {}

    async def capture(cfg, requests, traffic, state, tokenizer=None, on_done=None):
        seen["offsets"] = traffic.offsets
        state.bench_start = state.bench_end = 0.0

    monkeypatch.setattr(serve_cmd, "run_benchmark", capture)
    vllm = ["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "2", "--ramp-up-end-rps", "9"]
    res = runner.invoke(app, _base(scripted_server, tmp_path, n=6) + ["--seed", "3", *vllm])
    assert res.exit_code == 0, res.output
    assert seen["offsets"] == arrival_offsets(6, float("inf"), 1.0, 3, "linear", 2.0, 9.0)


def test_served_model_name_append_result_and_disable_tqdm(scripted_server, tmp_path):
    """vLLM's --served-model-name is what requests carry (the result's model_id stays --model);
    --append-result adds one JSON line per run; --disable-tqdm is --no-progress."""
    base = [a for a in _base(scripted_server, tmp_path, n=2) if a != "--no-progress"]
    args = base + [
        "--disable-tqdm", "--model", "my-org/the-model", "--served-model-name", "served",
        "--save-result", "--result-dir", str(tmp_path), "--result-filename", "runs.jsonl", "--append-result",
    ]  # fmt: skip
    for _ in range(2):
        res = runner.invoke(app, args)
        assert res.exit_code == 0, res.output
    assert {p["model"] for p in scripted_server.payloads} == {"served"}
    lines = (tmp_path / "runs.jsonl").read_text().splitlines()
    assert len(lines) == 2
    assert [json.loads(line)["model_id"] for line in lines] == ["my-org/the-model"] * 2
    res = runner.invoke(app, base + ["--append-result"])
    assert res.exit_code != 0 and "--append-result need --save-result" in res.output


def test_every_request_failing_saves_zeros_as_vllm_does(scripted_server, tmp_path):
    # vLLM: mean_ttft_ms = np.mean(ttfts or 0) * 1000, so a run with no successes writes 0, not null.
    args = ["serve", "--base-url", scripted_server.url, "--dataset", "custom", "--skip-chat-template",
            "--dataset-path", _custom(tmp_path, ["fail", "fail"]), "--num-prompts", "2", "--num-warmups", "0",
            "--no-progress", "--no-chart", "--save-result", "--result-dir", str(tmp_path),
            "--result-filename", "r.json"]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["completed"] == 0 and data["failed"] == 2
    for name in ("ttft", "tpot", "itl"):  # the default --percentile-metrics
        assert data[f"mean_{name}_ms"] == 0 and data[f"p99_{name}_ms"] == 0 and data[f"std_{name}_ms"] == 0
    assert data["metrics"]["ttft"]["mean_ms"] is None  # fd's own summary still says "no values"
