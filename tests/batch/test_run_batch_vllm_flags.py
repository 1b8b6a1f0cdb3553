"""vLLM's `run-batch` command lines run as `fd run-batch` unchanged: its long names -i/--input-file and
-o/--output-file (fd's --input/--output still work), --response-role with its effect, the flags fd has no
use for each accepted with one log line saying why, and --enable-metrics refused naming what to use.
The option tests patch the run out (no engine); one end-to-end run checks the effects in the output."""

from __future__ import annotations

import logging

import pytest
from batch_helpers import chat_line, cli_args, read_jsonl, run_cli, write_jsonl
from typer.testing import CliRunner

from fdcli.commands.run_batch import METRICS_REFUSED
from fdcli.main import app

runner = CliRunner()

NO_EFFECT = {  # flag (with its value) -> the words its one log line must hold
    ("--output-tmp-dir", "/tmp"): "--output-tmp-dir has no effect: fd writes the output to a local file",
    ("--max-log-len", "100"): "--max-log-len has no effect: fd logs no prompts",
    ("--url", "0.0.0.0"): "--url has no effect: it places vLLM's metrics server",
    ("--port", "8001"): "--port has no effect: it places vLLM's metrics server",
    ("--enable-prompt-tokens-details",): "--enable-prompt-tokens-details has no effect: fd always reports",
    ("--enable-force-include-usage",): "--enable-force-include-usage has no effect: every run-batch",
}


@pytest.fixture
def seen(monkeypatch):
    got = {}

    def fake_run(opts, engine_args):
        got.update(opts=opts, engine_args=engine_args)
        raise SystemExit(0)

    monkeypatch.setattr("fdcli_engine.entrypoints.batch.run_batch", fake_run)
    return got


@pytest.mark.parametrize(
    ("i", "o"), [("--input-file", "--output-file"), ("--input", "--output"), ("-i", "-o")]
)
def test_vllm_and_fd_names_of_input_and_output(seen, tmp_path, i, o):
    src = write_jsonl(tmp_path / "in.jsonl", [])
    r = runner.invoke(app, ["run-batch", i, str(src), o, str(tmp_path / "o.jsonl")])
    assert r.exit_code == 0, r.output
    assert (seen["opts"].input, seen["opts"].output) == (src, tmp_path / "o.jsonl")
    assert seen["opts"].serving.response_role == "assistant"  # vLLM's default


def test_response_role_reaches_the_serving_layer(seen, tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [])
    r = runner.invoke(
        app, ["run-batch", "--input-file", str(src), "--output-file", "-", "--response-role", "bot"]
    )
    assert r.exit_code == 0, r.output
    assert seen["opts"].serving.response_role == "bot"


@pytest.mark.parametrize("flag", list(NO_EFFECT))
def test_each_flag_without_effect_logs_one_line(seen, tmp_path, caplog, flag):
    src = write_jsonl(tmp_path / "in.jsonl", [])
    with caplog.at_level(logging.WARNING, logger="fd.batch"):
        r = runner.invoke(app, ["run-batch", "-i", str(src), "-o", "-", *flag])
    assert r.exit_code == 0, r.output
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "fd.batch"]
    assert len(lines) == 1 and NO_EFFECT[flag] in lines[0], lines


def test_no_flag_no_note(seen, tmp_path, caplog):
    src = write_jsonl(tmp_path / "in.jsonl", [])
    with caplog.at_level(logging.WARNING, logger="fd.batch"):
        assert runner.invoke(app, ["run-batch", "-i", str(src), "-o", "-"]).exit_code == 0
    assert not [rec for rec in caplog.records if rec.name == "fd.batch"]


def test_enable_metrics_is_refused_naming_what_to_use(seen, tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [])
    r = runner.invoke(app, ["run-batch", "-i", str(src), "-o", "-", "--enable-metrics", "--port", "9000"])
    assert r.exit_code == 2 and not seen
    assert r.stderr == f"Error: {METRICS_REFUSED}\n"
    assert "--summary-json" in r.stderr and "fd serve" in r.stderr and "/metrics" in r.stderr


def test_a_vllm_run_batch_line_runs_with_its_effects(tmp_path, tiny_model):
    """vLLM's launch line end to end: the role of a new turn is --response-role, a continued message
    keeps its own role, usage carries prompt_tokens_details, and each no-effect flag said so."""
    conv = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hel"}]
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [
            chat_line("new-turn", "hi", max_tokens=3),
            chat_line(
                "continued", "", max_tokens=3, messages=conv, add_generation_prompt=False,
                continue_final_message=True,
            ),
        ],
    )  # fmt: skip
    out = tmp_path / "out.jsonl"
    flags = [arg for flag in NO_EFFECT for arg in flag]
    proc = run_cli(
        cli_args(tiny_model, "--input-file", str(src), "--output-file", str(out), "--response-role", "bot")
        + flags
    )
    stderr = proc.stderr.decode()
    assert proc.returncode == 0, stderr[-2000:]
    recs = {r["custom_id"]: r["response"]["body"] for r in read_jsonl(out)}
    assert recs["new-turn"]["choices"][0]["message"]["role"] == "bot"
    assert recs["continued"]["choices"][0]["message"]["role"] == "assistant"
    for body in recs.values():
        assert body["usage"]["prompt_tokens_details"]["cached_tokens"] >= 0
    for words in NO_EFFECT.values():
        assert stderr.count(words) == 1, stderr[-3000:]
