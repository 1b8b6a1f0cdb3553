"""`fd bench latency` / `throughput` with a fake in-process LLM and a fake clock: exact figures."""

import json

import pytest
from typer.testing import CliRunner

import fdcli_engine.api
from fdcli.bench import offline
from fdcli.commands.bench import app
from fdcli_engine.outputs import CompletionOutput, RequestOutput

runner = CliRunner()
STEP_S = 0.5  # every generate() call takes exactly this long on the fake clock


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeTokenizer:
    vocab_size = 50


class FakeLLM:
    instances: list = []

    def __init__(self, **engine_kwargs):
        self.engine_kwargs = engine_kwargs
        self.tokenizer = FakeTokenizer()
        self.calls: list = []
        FakeLLM.instances.append(self)

    def get_stats(self):
        """Speculative decoding's keys when LLM() got a speculative_config: each generate() call
        verifies 2 steps of 3 drafts per prompt, 4 accepted, 6 tokens emitted."""
        n = len(self.calls)
        if "speculative_config" not in self.engine_kwargs:
            return {"num_running": 0}
        return {
            "spec_decode_num_drafts": 2 * n,
            "spec_decode_num_draft_tokens_total": 6 * n,
            "spec_decode_num_accepted_tokens_total": 4 * n,
            "spec_decode_num_emitted_tokens_total": 6 * n,
        }

    def generate(self, prompts, sampling_params, use_tqdm=False):
        self.calls.append((prompts, sampling_params))
        offline.clock.now += STEP_S
        n = sampling_params.max_tokens
        return [
            RequestOutput(str(i), None, list(p), [CompletionOutput(0, "", list(range(n)), "length")], True)
            for i, p in enumerate(prompts)
        ]


@pytest.fixture(autouse=True)
def fake_engine(monkeypatch):
    FakeLLM.instances = []
    monkeypatch.setattr(fdcli_engine.api, "LLM", FakeLLM, raising=False)
    monkeypatch.setattr(offline, "clock", FakeClock())


def test_latency_runs_warmups_then_timed_iterations(tmp_path):
    out = tmp_path / "lat.json"
    args = ["latency", "--input-len", "6", "--output-len", "4", "--batch-size", "3", "--num-iters-warmup", "2",
            "--num-iters", "3", "--percentiles", "50,90", "--output-json", str(out), "--max-num-seqs", "8",
            "--seed", "1"]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    (llm,) = FakeLLM.instances
    assert llm.engine_kwargs == {"max_num_seqs": 8, "seed": 1}  # shared engine options reach LLM()
    assert len(llm.calls) == 5
    prompts, params = llm.calls[-1]
    assert len(prompts) == 3 and all(len(p) == 6 and max(p) < 50 for p in prompts)
    assert params.temperature == 0 and params.max_tokens == 4 and params.ignore_eos
    data = json.loads(out.read_text())
    assert data["kind"] == "latency" and data["config"]["batch_size"] == 3
    m = data["metrics"]
    assert m["latency"] == {
        "mean_ms": 500.0,
        "median_ms": 500.0,
        "std_ms": 0.0,
        "p50_ms": 500.0,
        "p90_ms": 500.0,
    }
    assert m["output_tokens_per_iter"] == 12 and m["output_throughput"] == pytest.approx(24.0)
    assert m["total_token_throughput"] == pytest.approx((18 + 12) / 0.5)
    assert "Output token throughput" in res.stdout


def test_throughput_counts_returned_tokens(tmp_path):
    out = tmp_path / "tp.json"
    args = [
        "throughput",
        "--num-prompts",
        "10",
        "--input-len",
        "5",
        "--output-len",
        "7",
        "--output-json",
        str(out),
    ]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    (llm,) = FakeLLM.instances
    assert [len(c[0]) for c in llm.calls] == [4, 10]  # a small warmup batch, then all prompts at once
    m = json.loads(out.read_text())["metrics"]
    assert m["num_prompts"] == 10 and m["request_throughput"] == pytest.approx(20.0)
    assert m["output_throughput"] == pytest.approx(140.0)


@pytest.mark.parametrize(
    "args, message",
    [(["latency", "--batch-size", "0"], "--batch-size"), (["throughput", "--num-iters", "0"], "--num-iters"),
     (["latency", "--percentiles", "200"], "--percentiles")],
)  # fmt: skip
def test_bad_offline_options_are_one_line(args, message):
    res = runner.invoke(app, args)
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and message in res.stderr
    assert FakeLLM.instances == []  # rejected before the engine is built


def test_speculative_decoding_reports_the_timed_iterations_acceptance(tmp_path):
    out = tmp_path / "lat.json"
    spec = '{"method": "ngram", "num_speculative_tokens": 3}'
    args = ["latency", "--num-iters-warmup", "2", "--num-iters", "3", "--output-json", str(out),
            "--speculative-config", spec]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    (llm,) = FakeLLM.instances
    assert llm.engine_kwargs == {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3}}
    m = json.loads(out.read_text())["metrics"]
    # the 3 timed calls only (the 2 warm-ups are not counted): 6 steps, 18 drafts, 12 accepted
    assert m["spec_decode"] == {
        "num_drafts": 6,
        "num_draft_tokens": 18,
        "num_accepted_tokens": 12,
        "draft_acceptance_rate": pytest.approx(12 / 18),
        "mean_acceptance_length": 3.0,
    }
    assert "Draft acceptance rate" in res.stdout and "0.667" in res.stdout


def test_no_speculation_no_acceptance_figures(tmp_path):
    out = tmp_path / "lat.json"
    res = runner.invoke(app, ["latency", "--num-iters", "1", "--output-json", str(out)])
    assert res.exit_code == 0, res.output
    assert "spec_decode" not in json.loads(out.read_text())["metrics"]
    assert "acceptance" not in res.stdout
