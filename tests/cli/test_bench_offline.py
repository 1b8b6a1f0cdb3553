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

    def beam_search(self, prompts, params):
        """Each prompt's beam_width beams: the prompt, then max_tokens tokens (EOS ignored)."""
        from fdcli_engine.beam_search import BeamSearchOutput, BeamSearchSequence

        self.calls.append((prompts, params))
        offline.clock.now += STEP_S
        ids = [p["prompt_token_ids"] for p in prompts]
        return [
            BeamSearchOutput(
                [BeamSearchSequence(p + [7] * params.max_tokens) for _ in range(params.beam_width)]
            )
            for p in ids
        ]

    def generate(self, prompts, sampling_params, use_tqdm=False):
        self.calls.append((prompts, sampling_params))
        offline.clock.now += STEP_S
        plist = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        return [
            RequestOutput(
                str(i),
                None,
                list(p),
                [CompletionOutput(j, "", list(range(sp.max_tokens)), "length") for j in range(sp.n)],
                True,
            )
            for i, (p, sp) in enumerate(zip(prompts, plist, strict=True))
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
    data = json.loads(out.read_text())
    m = data["metrics"]
    assert m["num_prompts"] == 10 and m["request_throughput"] == pytest.approx(20.0)
    assert m["output_throughput"] == pytest.approx(140.0)
    # vllm/benchmarks/throughput.py's keys beside fd's: elapsed_time, num_requests, total_num_tokens,
    # requests/tokens_per_second.
    assert (data["elapsed_time"], data["num_requests"], data["total_num_tokens"]) == (STEP_S, 10, 120)
    assert data["requests_per_second"] == pytest.approx(20.0)
    assert data["tokens_per_second"] == pytest.approx(240.0)


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


def test_output_json_carries_vllm_latency_keys(tmp_path):
    # vllm/benchmarks/latency.py: avg_latency, std_latency, latencies (s), percentiles {pct: s}.
    out = tmp_path / "lat.json"
    args = ["latency", "--num-iters-warmup", "0", "--num-iters", "3", "--percentiles", "50,99",
            "--output-json", str(out)]  # fmt: skip
    assert runner.invoke(app, args).exit_code == 0
    data = json.loads(out.read_text())
    assert data["avg_latency"] == pytest.approx(STEP_S) and data["std_latency"] == pytest.approx(0.0)
    assert data["latencies"] == [STEP_S] * 3 and data["percentiles"] == {"50": STEP_S, "99": STEP_S}
    assert data["metrics"]["latency"]["mean_ms"] == pytest.approx(data["avg_latency"] * 1000)


def test_n_asks_for_several_completions_per_prompt(tmp_path):
    out = tmp_path / "lat.json"
    args = ["latency", "--batch-size", "2", "--output-len", "4", "--n", "3", "--num-iters-warmup", "0",
            "--num-iters", "1", "--output-json", str(out)]  # fmt: skip
    assert runner.invoke(app, args).exit_code == 0
    (llm,) = FakeLLM.instances
    assert llm.calls[-1][1].n == 3
    assert json.loads(out.read_text())["metrics"]["output_tokens_per_iter"] == 2 * 3 * 4


def test_throughput_range_ratio_and_prefix_len_shape_the_prompts():
    args = ["throughput", "--num-prompts", "40", "--input-len", "10", "--output-len", "8",
            "--random-range-ratio", "0.5", "--prefix-len", "3", "--num-iters-warmup", "0"]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    prompts, params = FakeLLM.instances[0].calls[-1]
    assert len({tuple(p[:3]) for p in prompts}) == 1  # one shared prefix
    in_lens = {len(p) - 3 for p in prompts}
    out_lens = {sp.max_tokens for sp in params}
    assert in_lens <= set(range(5, 16)) and len(in_lens) > 1
    assert out_lens <= set(range(4, 13)) and len(out_lens) > 1


@pytest.mark.parametrize(
    "args, message",
    [(["throughput", "--backend", "hf"], "--backend 'hf' is not supported"),
     (["throughput", "--dataset-name", "sharegpt"], "fd bench serve --dataset-name sharegpt"),
     (["throughput", "--random-range-ratio", "1"], "--random-range-ratio"),
     (["latency", "--n", "0"], "--n")],
)  # fmt: skip
def test_vllm_offline_choices_fd_lacks_are_refused_in_one_line(args, message):
    res = runner.invoke(app, args)
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and message in res.stderr
    assert FakeLLM.instances == []


def test_flags_without_effect_say_so():
    res = runner.invoke(app, ["throughput", "--async-engine", "--disable-detokenize", "--num-prompts", "2"])
    assert res.exit_code == 0, res.output
    assert "--async-engine has no effect" in res.stderr and "--disable-detokenize has no effect" in res.stderr


def test_latency_use_beam_search_times_beam_search_of_width_n(tmp_path):
    """vLLM's latency --use-beam-search: LLM.beam_search(BeamSearchParams(beam_width=n, max_tokens,
    ignore_eos=True)) in place of generate; the output tokens are the returned beams'."""
    from fdcli_engine.beam_search import BeamSearchParams

    out = tmp_path / "lat.json"
    args = ["latency", "--use-beam-search", "--n", "3", "--batch-size", "2", "--input-len", "5",
            "--output-len", "4", "--num-iters-warmup", "1", "--num-iters", "2", "--output-json", str(out)]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    (llm,) = FakeLLM.instances
    assert len(llm.calls) == 3
    prompts, params = llm.calls[-1]
    assert [len(p["prompt_token_ids"]) for p in prompts] == [5, 5]
    assert params == BeamSearchParams(beam_width=3, max_tokens=4, ignore_eos=True)
    m = json.loads(out.read_text())["metrics"]
    assert m["input_tokens_per_iter"] == 2 * 5 and m["output_tokens_per_iter"] == 2 * 3 * 4
