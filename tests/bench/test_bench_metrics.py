"""Metrics on hand-built records with exact timestamps; expected values computed by hand."""

import pytest

from fdcli.bench.metrics import (
    RequestRecord,
    compute_metrics,
    parse_goodput,
    parse_percentiles,
    request_itls,
)
from fdcli_engine.errors import ConfigError


def _rec(index, start, chunks, end, tokens, out, prompt_len=10, ok=True):
    return RequestRecord(
        index=index,
        ok=ok,
        prompt_len=prompt_len,
        output_tokens=out,
        output_tokens_source="usage",
        start=start,
        end=end,
        chunk_times=chunks,
        chunk_tokens=tokens,
    )


@pytest.fixture
def records():
    # r0: 4 one-token chunks at 0.1, 0.2, 0.4, 0.5 after a send at 0; stream ends at 0.5.
    r0 = _rec(0, 0.0, [0.1, 0.2, 0.4, 0.5], 0.5, [1, 1, 1, 1], 4)
    # r1: sent at 1.0; a 2-token first chunk at 1.3, then a 3-token chunk at 1.9; ends at 2.0.
    r1 = _rec(1, 1.0, [1.3, 1.9], 2.0, [2, 3], 5, prompt_len=20)
    failed = RequestRecord(index=2, ok=False, error="HTTP 500: boom", start=0.5, end=0.6)
    return [r0, r1, failed]


def test_per_token_itl_counts_zero_gaps_inside_multi_token_chunks(records):
    r0, r1, _ = records
    assert request_itls(r0, "token") == pytest.approx([0.1, 0.2, 0.1])
    # 5 tokens → 4 gaps: one zero inside the first chunk, the 0.6 s gap, two zeros inside the second.
    assert request_itls(r1, "token") == pytest.approx([0.0, 0.6, 0.0, 0.0])
    assert request_itls(r1, "chunk") == pytest.approx([0.6])


def test_summary_metrics_match_hand_computation(records):
    m = compute_metrics(records, duration=2.0, bench_start=0.0, percentiles=[50, 90])
    assert (m["num_requests"], m["completed"], m["failed"]) == (3, 2, 1)
    assert m["total_input_tokens"] == 30 and m["total_output_tokens"] == 9
    assert m["request_throughput"] == pytest.approx(1.0)
    assert m["output_throughput"] == pytest.approx(4.5)
    assert m["total_token_throughput"] == pytest.approx(19.5)
    # TTFT 100 ms and 300 ms.
    assert m["ttft"]["mean_ms"] == pytest.approx(200.0)
    assert m["ttft"]["median_ms"] == pytest.approx(200.0)
    assert m["ttft"]["std_ms"] == pytest.approx(100.0)
    assert m["ttft"]["p90_ms"] == pytest.approx(100 + 0.9 * 200)
    # TPOT: r0 (0.5-0.1)/3 = 133.33 ms; r1 (1.0-0.3)/4 = 175 ms.
    assert m["tpot"]["mean_ms"] == pytest.approx((400 / 3 + 175) / 2)
    # E2EL 500 and 1000 ms.
    assert m["e2el"]["mean_ms"] == pytest.approx(750.0)
    # ITL per token over both requests: [100, 200, 100, 0, 600, 0, 0] ms.
    assert m["itl_mode"] == "token"
    assert m["itl"]["mean_ms"] == pytest.approx(1000 / 7)
    assert m["itl"]["median_ms"] == pytest.approx(100.0)
    # Seconds [0,1): r0's 4 tokens; [1,2): r1's 2 + 3.
    assert m["throughput_series"] == [4.0, 5.0]
    assert m["peak_output_throughput"] == 5.0
    assert m["errors"] == [{"index": 2, "error": "HTTP 500: boom"}]


def test_chunk_mode_when_chunk_token_counts_are_unknown(records):
    records[1].chunk_tokens = None
    m = compute_metrics(records, duration=2.0, bench_start=0.0, percentiles=[50])
    assert m["itl_mode"] == "chunk"
    # Chunk gaps: r0 [100, 200, 100], r1 [600].
    assert m["itl"]["mean_ms"] == pytest.approx(250.0)
    # r1's 5 tokens spread evenly over its 2 chunks, both in second 1.
    assert m["throughput_series"] == [4.0, 5.0]


def test_goodput_counts_requests_meeting_every_slo(records):
    slo = parse_goodput(["ttft:200", "tpot:150"])
    m = compute_metrics(records, duration=2.0, bench_start=0.0, percentiles=[50], goodput_slo=slo)
    # r0: ttft 100 ≤ 200, tpot 133 ≤ 150 → good; r1: ttft 300 > 200 → not; the failure never counts.
    assert m["good_requests"] == 1
    assert m["goodput"] == pytest.approx(0.5)
    slo = parse_goodput("e2el:1000")
    m = compute_metrics(records, duration=2.0, bench_start=0.0, percentiles=[50], goodput_slo=slo)
    assert m["good_requests"] == 2


def test_no_successful_requests_gives_null_latencies_not_a_crash():
    failed = [RequestRecord(index=0, ok=False, error="timeout")]
    m = compute_metrics(failed, duration=1.0, bench_start=0.0, percentiles=[99])
    assert m["completed"] == 0 and m["failed"] == 1
    assert m["ttft"] == {"mean_ms": None, "median_ms": None, "std_ms": None, "p99_ms": None}
    assert m["peak_output_throughput"] == 0.0


@pytest.mark.parametrize("spec", ["ttft", "ttft:abc", "latency:100", "tpot:-5", "e2el:0"])
def test_bad_goodput_specs_are_config_errors(spec):
    with pytest.raises(ConfigError, match="--goodput"):
        parse_goodput(spec)


def test_goodput_spec_accepts_commas_and_spaces():
    assert parse_goodput("ttft:200,tpot:50 e2el:1500") == {"ttft": 0.2, "tpot": 0.05, "e2el": 1.5}


def test_percentile_parsing():
    assert parse_percentiles("50,90,99.9") == [50.0, 90.0, 99.9]
    for bad in ("", "50,abc", "101"):
        with pytest.raises(ConfigError):
            parse_percentiles(bad)
