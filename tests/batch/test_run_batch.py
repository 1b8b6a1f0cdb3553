"""`fd run-batch` end to end on a tiny random Llama: answers equal `fd serve`'s for the same bodies,
every kind of bad line gets one error record, --strict, duplicates, stdin/stdout."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import httpx
import pytest
from batch_helpers import chat_line, cli_args, completion_line, read_jsonl, run_cli, write_jsonl

from fdcli_engine.entrypoints.batch import BatchOptions, run_batch
from fdcli_engine.entrypoints.batch.files import partial_path

GOOD_LINES = [
    chat_line("chat-1", "hello there", max_tokens=12),
    completion_line("cmpl-1", "once upon a time", max_tokens=10),
    chat_line("chat-2", "what is two plus two?", max_tokens=6, n=2, seed=5, temperature=0),
    completion_line("cmpl-2", ["ab", "cd"], max_tokens=5, logprobs=2),
    completion_line("cmpl-3", [5, 6, 7, 8], max_tokens=7, return_token_ids=True),
    chat_line("chat-3", "stop early", max_tokens=30, stop=["e"], ignore_eos=True),
]


def _fd_server():
    path = Path(__file__).resolve().parents[1] / "server" / "fd_server.py"
    spec = importlib.util.spec_from_file_location("fd_server_for_batch", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _run(tmp_path, lines, engine_factory, **opts):
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    summary = run_batch(BatchOptions(input=src, output=out, progress=False, **opts), {}, engine_factory)
    return summary, out


def _comparable(body: dict) -> dict:
    return {k: v for k, v in body.items() if k not in ("id", "created")}


def assert_same(got, want, where="body"):
    """Equal JSON, except that floats (logprobs) may differ by batching round-off (1e-4)."""
    if isinstance(want, float):
        assert got == pytest.approx(want, abs=1e-4), where
    elif isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want), where
        for k in want:
            assert_same(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{where}[{i}]")
    else:
        assert got == want, where


def test_answers_equal_the_servers_for_the_same_bodies(tmp_path, tiny_model, engine_factory):
    summary, out = _run(tmp_path, GOOD_LINES, engine_factory)
    assert summary.status == "completed" and summary.succeeded == len(GOOD_LINES) and summary.failed == 0
    records = read_jsonl(out)
    assert not partial_path(out).exists()
    assert [r["custom_id"] for r in records] == [line["custom_id"] for line in GOOD_LINES]  # input order

    fd_server = _fd_server()
    srv = fd_server.start_server(
        tiny_model, tmp_path, "--served-model-name", "tiny", "--max-model-len", "128", api_key=None
    )
    try:
        with httpx.Client(base_url=srv.url, timeout=120) as http:
            for line, rec in zip(GOOD_LINES, records):
                answer = http.post(line["url"], json=line["body"])
                assert answer.status_code == 200, answer.text
                expected = answer.json()
                assert rec["error"] is None
                assert rec["response"]["status_code"] == 200
                assert rec["response"]["request_id"] == rec["response"]["body"]["id"]
                assert_same(_comparable(rec["response"]["body"]), _comparable(expected), line["custom_id"])
    finally:
        assert srv.stop() == 0
    usage = [r["response"]["body"]["usage"] for r in records]
    assert summary.prompt_tokens == sum(u["prompt_tokens"] for u in usage)
    assert summary.completion_tokens == sum(u["completion_tokens"] for u in usage)


def test_every_kind_of_bad_line_gets_one_error_record_and_good_lines_are_answered(tmp_path, engine_factory):
    lines = [
        chat_line("good-1", "hi", max_tokens=4),
        "{this is not json",
        "[1, 2, 3]",
        {"method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}},
        {"custom_id": "no-url", "method": "POST", "body": {"prompt": "x"}},
        {"custom_id": "bad-url", "method": "POST", "url": "/v1/nope", "body": {"prompt": "x"}},
        {"custom_id": "no-body", "method": "POST", "url": "/v1/completions"},
        completion_line("streaming", "x", stream=True),
        completion_line("unknown-field", "x", 4, temperatur=0.5),  # ignored, as `fd serve` does
        completion_line("bad-model", "x", model="gpt-4o"),
        completion_line("too-long", list(range(1, 201))),
        chat_line("empty-messages", "x") | {"body": {"messages": [], "max_tokens": 3}},
        completion_line("good-2", "the end", max_tokens=4),
        {"custom_id": "embed-on-llm", "method": "POST", "url": "/v1/embeddings", "body": {"input": "hi"}},
        {"custom_id": "pool-on-llm", "method": "POST", "url": "/pooling", "body": {"input": "hi"}},
    ]
    summary, out = _run(tmp_path, lines, engine_factory)
    records = read_jsonl(out)
    assert len(records) == len(lines)
    assert summary.status == "lines_failed" and (summary.succeeded, summary.failed) == (3, len(lines) - 3)
    by_line = {i + 1: r for i, r in enumerate(records)}  # one record per line, in input order
    for line_no in (1, 9, 13):  # the good lines
        assert by_line[line_no]["error"] is None
        assert by_line[line_no]["response"]["body"]["choices"][0]["finish_reason"] in ("length", "stop")
    expected = {
        2: ("invalid_json", None, None),
        3: ("invalid_line", None, None),
        4: ("missing_custom_id", None, None),
        5: ("missing_url", "no-url", None),
        6: ("invalid_url", "bad-url", None),
        7: ("missing_body", "no-body", None),
        8: ("stream_unsupported", "streaming", None),
        10: ("model_not_found", "bad-model", 404),
        11: ("context_length_exceeded", "too-long", 400),  # OpenAI's code
        12: ("invalid_request_error", "empty-messages", 400),  # the serving layer's (prompt_token_ids)
        14: ("invalid_request_error", "embed-on-llm", 400),  # a generate model serves no embeddings
        15: ("invalid_request_error", "pool-on-llm", 400),  # nor vLLM's /pooling (a url run-batch takes)
    }
    for line_no, (code, custom_id, status) in expected.items():
        rec = by_line[line_no]
        assert rec["custom_id"] == custom_id, line_no
        assert rec["error"]["code"] == code, (line_no, rec["error"])
        assert rec["error"]["line"] == line_no
        if status is None:
            assert rec["response"] is None
        else:
            assert rec["response"]["status_code"] == status
            assert rec["response"]["body"]["error"]["message"] == rec["error"]["message"]
    assert by_line[15]["error"]["message"].startswith("The model does not support Pooling API")
    assert "200 tokens" in by_line[11]["error"]["message"] and "128" in by_line[11]["error"]["message"]


def test_strict_stops_at_the_first_bad_line(tmp_path, engine_factory):
    lines = [chat_line("a", "hi", max_tokens=3), "oops", chat_line("c", "never", max_tokens=3)]
    summary, out = _run(tmp_path, lines, engine_factory, strict=True)
    assert summary.status == "stopped" and "line 2" in summary.message
    assert not out.exists()  # not renamed: the run did not finish
    records = read_jsonl(partial_path(out))
    assert [(r["custom_id"], r["error"] is None) for r in records] == [("a", True), (None, False)]


def test_duplicate_ids_fail_before_any_model_work(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [chat_line("a", "x"), chat_line("b", "y"), chat_line("a", "z")])
    out = tmp_path / "out.jsonl"
    # A model path that does not exist: if the run got as far as loading a model it would fail differently.
    proc = run_cli(cli_args(tmp_path / "no-such-model", "-i", str(src), "-o", str(out)))
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.decode().strip().splitlines()
    assert err == ["Error: duplicate custom_id: 'a' on lines 1 and 3; every custom_id must be unique"]
    assert not out.exists() and not partial_path(out).exists()


def test_stdin_to_stdout_with_summary_json_and_exit_code(tmp_path, tiny_model):
    lines = [completion_line("a", "hello", max_tokens=3), "bad", completion_line("b", "bye", max_tokens=3)]
    data = "".join(json.dumps(x) + "\n" if isinstance(x, dict) else x + "\n" for x in lines)
    summary_file = tmp_path / "summary.json"
    proc = run_cli(
        cli_args(tiny_model, "-i", "-", "-o", "-", "--summary-json", str(summary_file)), input=data.encode()
    )
    assert proc.returncode == 3, proc.stderr  # finished, but a line failed
    records = [json.loads(x) for x in proc.stdout.decode().splitlines()]
    assert [r["custom_id"] for r in records] == ["a", None, "b"]
    assert records[1]["error"]["line"] == 2
    summary = json.loads(summary_file.read_text())
    assert (summary["total"], summary["succeeded"], summary["failed"], summary["status"]) == (
        3,
        2,
        1,
        "lines_failed",
    )
    assert summary["completion_tokens"] == sum(
        r["response"]["body"]["usage"]["completion_tokens"] for r in records if r["error"] is None
    )
    assert "3 lines, 2 succeeded, 1 failed" in proc.stderr.decode()


@pytest.mark.parametrize("window", [1, 3])
def test_small_windows_keep_input_order(tmp_path, engine_factory, window):
    # Long and short requests interleaved: short ones finish first but must wait in the reorder buffer.
    lines = [
        completion_line(f"r{i}", f"p{i}", max_tokens=20 if i % 2 == 0 else 2, ignore_eos=True)
        for i in range(9)
    ]
    summary, out = _run(tmp_path, lines, engine_factory, max_inflight=window)
    records = read_jsonl(out)
    assert [r["custom_id"] for r in records] == [f"r{i}" for i in range(9)]
    assert [r["response"]["body"]["usage"]["completion_tokens"] for r in records] == [
        20 if i % 2 == 0 else 2 for i in range(9)
    ]


def test_cli_all_good_exits_0_and_renames_the_partial(tmp_path, tiny_model):
    src = write_jsonl(
        tmp_path / "in.jsonl", [chat_line("a", "hi", max_tokens=3), completion_line("b", "yo", 2)]
    )
    out = tmp_path / "out.jsonl"
    proc = run_cli(cli_args(tiny_model, "-i", str(src), "-o", str(out)))
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert [r["custom_id"] for r in read_jsonl(out)] == ["a", "b"]
    assert not partial_path(out).exists()
    assert "completed: 2 lines, 2 succeeded, 0 failed" in proc.stderr.decode()


def test_a_model_that_fails_to_load_is_one_line_and_leaves_no_partial(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [chat_line("a", "x")])
    out = tmp_path / "out.jsonl"
    proc = run_cli(cli_args(tmp_path / "missing-model", "-i", str(src), "-o", str(out)))
    assert proc.returncode == 2
    err = proc.stderr.decode().strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error: model path") and "does not exist" in err[0]
    assert not out.exists() and not partial_path(out).exists()
