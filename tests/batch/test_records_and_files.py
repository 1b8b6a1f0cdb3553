"""Envelope parsing, the duplicate-id scan and --resume bookkeeping, without a model."""

from __future__ import annotations

import json

import pytest
from batch_helpers import chat_line, write_jsonl

from fdcli_engine.entrypoints.batch.files import (
    DuplicateIdsError,
    OutputWriter,
    partial_path,
    prepare_output,
    scan_input,
    spool_stdin,
)
from fdcli_engine.entrypoints.batch.records import (
    LineError,
    dump_record,
    error_record,
    parse_line,
    record_key,
    success_record,
)
from fdcli_engine.entrypoints.openai.routes import BATCH_ROUTES

GOOD = {"custom_id": "x", "method": "POST", "url": "/v1/completions", "body": {"prompt": "hi"}}

BAD_LINES = [
    # (raw line, expected code, expected custom_id, substring of the message)
    (b"{not json", "invalid_json", None, "not valid JSON"),
    (b"\xff\xfe{}", "invalid_json", None, "UTF-8"),
    (b"[1, 2]", "invalid_line", None, "not an array"),
    (b'"just a string"', "invalid_line", None, "not a string"),
    (json.dumps({**GOOD, "custom_id": None}).encode(), "missing_custom_id", None, "no custom_id"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "custom_id"}).encode(), "missing_custom_id", None, ""),
    (json.dumps({**GOOD, "custom_id": 7}).encode(), "invalid_custom_id", None, "not a number"),
    (json.dumps({**GOOD, "custom_id": ""}).encode(), "invalid_custom_id", None, "1 to 512"),
    (json.dumps({**GOOD, "extra": 1}).encode(), "invalid_line", "x", "'extra'"),
    (json.dumps({**GOOD, "method": "GET"}).encode(), "invalid_method", "x", "'GET'"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "url"}).encode(), "missing_url", "x", "no url"),
    (json.dumps({**GOOD, "url": "/v1/images/generations"}).encode(), "invalid_url", "x", "/v1/embeddings"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "body"}).encode(), "missing_body", "x", "no body"),
    (json.dumps({**GOOD, "body": [1]}).encode(), "invalid_body", "x", "not an array"),
    (
        json.dumps({**GOOD, "body": {"prompt": "a", "stream": True}}).encode(),
        "stream_unsupported",
        "x",
        "stream",
    ),
]


@pytest.mark.parametrize("raw,code,custom_id,fragment", BAD_LINES)
def test_bad_envelopes_are_line_errors(raw, code, custom_id, fragment):
    with pytest.raises(LineError) as info:
        parse_line(4, raw, BATCH_ROUTES)
    assert info.value.code == code
    assert info.value.custom_id == custom_id
    assert fragment in info.value.message


def test_good_envelope_and_default_method():
    line = parse_line(2, json.dumps({k: v for k, v in GOOD.items() if k != "method"}).encode(), BATCH_ROUTES)
    assert (line.line_no, line.custom_id, line.url, line.body) == (
        2,
        "x",
        "/v1/completions",
        {"prompt": "hi"},
    )


def test_record_shapes_match_openai_batch_output():
    ok = json.loads(dump_record(success_record("a", "cmpl-1", {"id": "cmpl-1"})))
    assert list(ok) == ["id", "custom_id", "response", "error"]
    assert ok["id"].startswith("batch_req_") and ok["error"] is None
    assert ok["response"] == {"status_code": 200, "request_id": "cmpl-1", "body": {"id": "cmpl-1"}}
    bad = error_record(9, None, "invalid_json", "boom")
    assert bad["response"] is None and bad["error"] == {"code": "invalid_json", "message": "boom", "line": 9}
    assert record_key(ok) == ("id", "a") and record_key(bad) == ("line", 9)
    assert dump_record(ok).endswith("}\n") and dump_record(ok).count("\n") == 1


def test_scan_counts_lines_and_names_both_lines_of_a_duplicate(tmp_path):
    path = write_jsonl(
        tmp_path / "in.jsonl", [chat_line("a", "x"), "garbage", "", chat_line("b", "y"), chat_line("a", "z")]
    )
    with pytest.raises(DuplicateIdsError, match=r"'a' on lines 1 and 5"):
        scan_input(path)
    ok = write_jsonl(tmp_path / "ok.jsonl", [chat_line("a", "x"), "garbage", "", chat_line("b", "y")])
    result = scan_input(ok)
    assert result.num_lines == 3  # the blank line is not a line of work
    assert result.first_line == {"a": 1, "b": 4}


def test_spool_stdin_copies_the_stream(tmp_path):
    import io

    data = b"".join(json.dumps(chat_line(str(i), "x" * 100)).encode() + b"\n" for i in range(50))
    path = spool_stdin(io.BytesIO(data))
    try:
        assert path.read_bytes() == data
    finally:
        path.unlink()


def _rec(cid, text="t"):
    return dump_record(success_record(cid, "r", {"text": text}))


def test_resume_drops_a_torn_tail_and_merges_a_previous_output(tmp_path):
    out = tmp_path / "out.jsonl"
    part = partial_path(out)
    a, b, c = _rec("a"), _rec("b"), _rec("c")
    part.write_text(a + b + c[: len(c) // 2], encoding="utf-8")  # killed mid-write of "c"
    out.write_text(b + _rec("d"), encoding="utf-8")  # an earlier completed run also answered b and d
    done, carried = prepare_output(out, resume=True)
    assert done == {("id", "a"): True, ("id", "b"): True, ("id", "d"): True}
    assert carried == 3
    lines = part.read_text(encoding="utf-8").splitlines(keepends=True)
    assert lines[:2] == [a, b]  # earlier results byte-identical, the torn line gone
    assert [json.loads(x)["custom_id"] for x in lines] == ["a", "b", "d"]


def test_without_resume_the_partial_starts_empty_and_out_is_untouched(tmp_path):
    out = tmp_path / "out.jsonl"
    old = _rec("old")
    out.write_text(old, encoding="utf-8")
    partial_path(out).write_text(_rec("stale"), encoding="utf-8")
    assert prepare_output(out, resume=False) == ({}, 0)
    assert partial_path(out).read_bytes() == b""
    assert out.read_text(encoding="utf-8") == old
    w, new = OutputWriter(out), _rec("new")
    w.write(new)
    w.commit()
    assert out.read_text(encoding="utf-8") == new and not partial_path(out).exists()


def test_progress_bar_and_summary_text():
    import io

    from rich.console import Console

    from fdcli_engine.entrypoints.batch.summary import BatchProgress, BatchSummary

    buf = io.StringIO()
    bar = BatchProgress(4, console=Console(file=buf, force_terminal=True, width=120))
    s = BatchSummary(total=4, succeeded=3, failed=1, prompt_tokens=10, completion_tokens=30, wall_time_s=2.0)
    bar.advance(s)
    bar._p.refresh()
    bar.close()
    assert "4/4" in buf.getvalue() and "tok/s" in buf.getvalue()
    assert s.lines()[0].endswith("4 lines, 3 succeeded, 1 failed, 0 skipped (already done)")
    assert "15.0 output tok/s, 20.0 total tok/s" in s.lines()[1]
    d = s.to_dict()
    assert (d["output_tokens_per_s"], d["total_tokens_per_s"]) == (15.0, 20.0)
