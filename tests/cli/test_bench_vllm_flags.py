"""`fd bench serve` takes `vllm bench serve` command lines: vLLM's backend names, its sampling flags
and --extra-body in every request body, x-request-id from --request-id-prefix, --input-len/--output-len,
and a one-line note or refusal for the flags fd cannot honour (vllm/benchmarks/serve.py, add_cli_args
and main_async; lib/endpoint_request_func.py)."""

import json
import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.append(str(Path(__file__).resolve().parents[1] / "bench"))  # for bench_support

from bench_support import free_port, running_server, train_bpe  # noqa: E402

from fdcli.bench.datasets import SampleRequest  # noqa: E402
from fdcli.bench.early_stop import early_stop_warning  # noqa: E402
from fdcli.bench.metrics import RequestRecord  # noqa: E402
from fdcli.commands.bench import app  # noqa: E402

runner = CliRunner()


@pytest.fixture
def scripted_server():
    with running_server() as state:
        yield state


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_bpe().save(str(path))
    return str(path)


def _base(server, tmp_path, n=2):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": "ok", "output_tokens": 3}) + "\n" for _ in range(n)))
    return ["serve", "--base-url", server.url, "--dataset-name", "custom", "--skip-chat-template",
            "--dataset-path", str(path), "--num-prompts", str(n), "--num-warmups", "0",
            "--no-progress", "--no-chart"]  # fmt: skip


def test_vllm_backend_is_the_completions_backend(scripted_server, tmp_path):
    out = tmp_path / "r.json"
    args = _base(scripted_server, tmp_path) + [
        "--backend",
        "vllm",
        "--save-result",
        "--result-filename",
        str(out),
    ]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert all("prompt" in p for p in scripted_server.payloads) and len(scripted_server.payloads) == 2
    data = json.loads(out.read_text())
    assert data["backend"] == "vllm" and data["completed"] == 2  # the name the user gave, as vLLM writes it


def test_unknown_backend_names_the_ones_fd_has():
    res = runner.invoke(
        app, ["serve", "--port", str(free_port()), "--ready-timeout", "600", "--backend", "tgi"]
    )
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert (
        "'tgi' is not supported" in res.stderr and "vllm" in res.stderr and "openai-embeddings" in res.stderr
    )


def test_sampling_flags_extra_body_and_request_ids_reach_every_request(scripted_server, tmp_path):
    extra = {"min_p": 0.3, "min_tokens": 2, "chat_template_kwargs": {"enable_thinking": False}}
    args = _base(scripted_server, tmp_path) + [
        "--min-p", "0.1", "--frequency-penalty", "0.5", "--presence-penalty", "0.25",
        "--repetition-penalty", "1.1", "--logprobs", "2", "--extra-body", json.dumps(extra),
        "--request-id-prefix", "run7-",
    ]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    for body in scripted_server.payloads:
        assert body["min_p"] == 0.3  # --extra-body wins over the flag, as vLLM merges them
        assert (body["frequency_penalty"], body["presence_penalty"], body["repetition_penalty"]) == (
            0.5,
            0.25,
            1.1,
        )
        assert body["logprobs"] == 2 and body["min_tokens"] == 2
        assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert sorted(scripted_server.request_ids) == ["run7-0", "run7-1"]


def test_logprobs_on_chat_and_the_default_request_id_prefix(scripted_server, tmp_path):
    res = runner.invoke(
        app, _base(scripted_server, tmp_path) + ["--backend", "openai-chat", "--logprobs", "3"]
    )
    assert res.exit_code == 0, res.output
    assert {(p["logprobs"], p["top_logprobs"]) for p in scripted_server.payloads} == {(True, 3)}
    ids = scripted_server.request_ids
    assert all(re.fullmatch(r"bench-[0-9a-f]{8}-[01]", i) for i in ids) and len({i[:15] for i in ids}) == 1


def test_input_len_and_output_len_map_onto_the_random_dataset(scripted_server, tokenizer_json):
    args = ["serve", "--base-url", scripted_server.url, "--tokenizer", tokenizer_json, "--num-prompts", "2",
            "--input-len", "5", "--output-len", "2", "--random-input-len", "40", "--num-warmups", "0",
            "--no-progress", "--no-chart"]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    from fdcli.bench.tokenize import load_tokenizer

    tok, _ = load_tokenizer(tokenizer_json)
    assert [len(tok.encode(p["prompt"])) for p in scripted_server.payloads] == [5, 5]
    assert {p["max_tokens"] for p in scripted_server.payloads} == {2}


@pytest.mark.parametrize(
    "flag, message",
    [
        ("--profile", "--profile is not supported"),
    ],
)
def test_refused_flags_are_one_line_before_any_network_call(flag, message):
    res = runner.invoke(app, ["serve", "--port", str(free_port()), "--ready-timeout", "600", flag])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and message in res.stderr


@pytest.mark.parametrize("body, message", [("{oops", "not valid JSON"), ("[1]", "must be a JSON object")])
def test_bad_extra_body_is_one_line(body, message):
    res = runner.invoke(
        app, ["serve", "--port", str(free_port()), "--ready-timeout", "600", "--extra-body", body]
    )
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and message in res.stderr


def test_flags_without_effect_say_so_and_the_run_goes_on(scripted_server, tmp_path):
    args = _base(scripted_server, tmp_path) + [
        "--tokenizer-mode", "mistral", "--trust-remote-code", "--plot-timeline", "--skip-tokenizer-init",
        "--use-beam-search",
        "--disable-shuffle", "--no-oversample",
    ]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "--tokenizer-mode mistral has no effect" in res.stderr
    assert "--trust-remote-code has no effect" in res.stderr and "--plot-timeline has no effect" in res.stderr
    assert "--use-beam-search has no effect" in res.stderr
    assert not any("use_beam_search" in p for p in scripted_server.payloads)  # vLLM's sends nothing either
    assert "no tokenizer (--skip-tokenizer-init)" in res.stderr
    assert len(scripted_server.payloads) == 2


def test_insecure_and_ready_check_timeout_reach_the_ready_check(monkeypatch, tmp_path):
    seen = {}

    def fake_wait_ready(base_url, headers, timeout, verify=True):
        seen.update(timeout=timeout, verify=verify)
        raise SystemExit(0)

    monkeypatch.setattr("fdcli.bench.serve_cmd.wait_ready", fake_wait_ready)
    runner.invoke(app, ["serve", "--base-url", "https://example.invalid", "--insecure",
                        "--ready-check-timeout-sec", "7"])  # fmt: skip
    assert seen == {"timeout": 7.0, "verify": False}


def test_embeddings_never_warn_about_short_replies():
    records = [RequestRecord(index=i, ok=True, output_tokens=0) for i in range(2)]
    requests = [SampleRequest("text", 3, 128)] * 2
    assert early_stop_warning(records, requests, "embeddings", ignore_eos=False) is None
    assert early_stop_warning(records, requests, "openai", ignore_eos=False) is not None


def test_defaults_are_vllm_bench_serves(scripted_server, tokenizer_json, tmp_path):
    # vllm/benchmarks/serve.py: --num-warmups 0; no temperature unless --temperature; ignore_eos on
    # for the random dataset on OpenAI-compatible backends; --metric-percentiles 99 and
    # --percentile-metrics ttft,tpot,itl for generation.
    out = tmp_path / "r.json"
    args = ["serve", "--base-url", scripted_server.url, "--tokenizer", tokenizer_json, "--num-prompts", "2",
            "--random-input-len", "4", "--random-output-len", "2", "--no-progress", "--no-chart",
            "--save-result", "--result-filename", str(out)]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert len(scripted_server.payloads) == 2  # no warm-up request
    for body in scripted_server.payloads:
        assert "temperature" not in body and body["ignore_eos"] is True
    data = json.loads(out.read_text())
    assert {"p99_ttft_ms", "p99_tpot_ms", "p99_itl_ms"} <= data.keys()
    assert not {"p50_ttft_ms", "p90_ttft_ms", "mean_e2el_ms"} & data.keys()


def test_custom_dataset_sends_no_ignore_eos_and_temperature_when_given(scripted_server, tmp_path):
    res = runner.invoke(app, _base(scripted_server, tmp_path) + ["--temperature", "0"])
    assert res.exit_code == 0, res.output
    assert {(b["temperature"], "ignore_eos" in b) for b in scripted_server.payloads} == {(0.0, False)}


def test_embeddings_default_percentile_metric_is_e2el():
    from fdcli.bench.vllm_flags import default_percentile_metrics

    assert default_percentile_metrics("embeddings") == "e2el"
    assert default_percentile_metrics("openai-chat") == "ttft,tpot,itl"


@pytest.mark.parametrize("kwargs, head", [(None, "N:"), ('{"enable_thinking": true}', "T:")])
def test_chat_template_kwargs_reach_the_client_side_template_only(scripted_server, tmp_path, kwargs, head):
    # vLLM forwards --chat-template-kwargs to the tokenizer's apply_chat_template of the datasets
    # that render prompts client-side (custom); it never puts them in the request.
    folder = tmp_path / "tok"
    folder.mkdir()
    train_bpe().save(str(folder / "tokenizer.json"))
    template = "{% if enable_thinking %}T{% else %}N{% endif %}:{{ messages[0]['content'] }}"
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "hello", "output_tokens": 2}) + "\n")
    args = ["serve", "--base-url", scripted_server.url, "--tokenizer", str(folder), "--dataset-name", "custom",
            "--dataset-path", str(path), "--num-prompts", "1", "--no-progress", "--no-chart"]  # fmt: skip
    res = runner.invoke(app, args + (["--chat-template-kwargs", kwargs] if kwargs else []))
    assert res.exit_code == 0, res.output
    [body] = scripted_server.payloads
    assert body["prompt"] == f"{head}hello" and "chat_template_kwargs" not in body


def test_bad_chat_template_kwargs_is_one_line():
    res = runner.invoke(
        app, ["serve", "--port", str(free_port()), "--ready-timeout", "600", "--chat-template-kwargs", "[1]"]
    )
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert "--chat-template-kwargs must be a JSON object" in res.stderr
