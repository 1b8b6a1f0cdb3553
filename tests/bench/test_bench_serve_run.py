"""The benchmark loop against the scripted server: counts, failures, timings, concurrency, payloads."""

import asyncio
import math

import pytest
from bench_support import FIRST_TOKEN_DELAY, TOKEN_GAP, free_port

from fdcli.bench.client import BackendConfig
from fdcli.bench.datasets import SampleRequest
from fdcli.bench.metrics import compute_metrics
from fdcli.bench.request_loop import RunState, ServerNotReady, TrafficConfig, run_benchmark, wait_ready

# Scheduling jitter on a shared 2-core machine: measured times may exceed server sleeps by this much.
SLACK = 1.0


def _run(url, prompts, tokenizer=None, backend="openai", max_concurrency=None, timeout=10.0, **kw):
    cfg = BackendConfig(base_url=url, backend=backend, model="scripted-model", request_timeout=timeout, **kw)
    reqs = [SampleRequest(p, 3, n) for p, n in prompts]
    traffic = TrafficConfig([0.0] * len(reqs), max_concurrency, num_warmups=0)
    state = asyncio.run(run_benchmark(cfg, reqs, traffic, RunState(), tokenizer))
    return {r.index: r for r in state.records}, state


@pytest.mark.parametrize("backend", ["openai", "openai-chat"])
def test_one_token_chunks_with_usage(scripted_server, backend):
    recs, state = _run(
        scripted_server.url, [("ok", 4)], backend=backend, temperature=0.5, top_k=5, ignore_eos=True
    )
    r = recs[0]
    assert r.ok, r.error
    assert r.output_tokens == 4 and r.output_tokens_source == "usage" and r.prompt_len == 7
    assert r.chunk_tokens == [1, 1, 1, 1]  # the chat role-only chunk did not count
    assert r.ttft < FIRST_TOKEN_DELAY + SLACK
    # Chunk k leaves the server FIRST_TOKEN_DELAY + k * TOKEN_GAP after the request: it cannot be seen
    # earlier. (A gap between two arrivals has no lower bound: a late chunk shortens the gap after it.)
    for k, t in enumerate(r.chunk_times):
        assert t - r.start >= (FIRST_TOKEN_DELAY + k * TOKEN_GAP) * 0.999  # timers may fire a hair early
    gaps = [b - a for a, b in zip(r.chunk_times, r.chunk_times[1:], strict=False)]
    assert all(0 <= g < TOKEN_GAP + SLACK for g in gaps)
    assert r.tpot >= (r.chunk_times[-1] - r.chunk_times[0]) / 3 >= 0
    # Sampling flags reach the server on both backends, top_k/ignore_eos as extra fields.
    body = scripted_server.payloads[0]
    assert body["temperature"] == 0.5 and body["top_k"] == 5 and body["ignore_eos"] is True
    assert body["max_tokens"] == 4 and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert ("messages" in body) == (backend == "openai-chat")


def test_multi_token_chunks_give_per_token_itl_with_zero_gaps(scripted_server, word_tokenizer):
    recs, state = _run(scripted_server.url, [("multi", 5)], tokenizer=word_tokenizer)
    r = recs[0]
    assert r.ok and r.output_tokens == 5 and r.chunk_tokens == [2, 3]
    m = compute_metrics(list(recs.values()), 1.0, state.bench_start, [50])
    assert m["itl_mode"] == "token"
    # 5 tokens → 4 ITL values: 0 (inside chunk 1), the real gap, 0, 0 → median 0.
    assert m["itl"]["median_ms"] == 0.0
    assert m["itl"]["mean_ms"] == pytest.approx((r.chunk_times[1] - r.chunk_times[0]) * 1000 / 4)


def test_multi_token_chunks_without_tokenizer_fall_back_to_chunk_itl(scripted_server):
    recs, state = _run(scripted_server.url, [("multi", 5)])
    m = compute_metrics(list(recs.values()), 1.0, state.bench_start, [50])
    assert m["itl_mode"] == "chunk" and recs[0].chunk_tokens is None
    assert m["itl"]["mean_ms"] == pytest.approx((recs[0].chunk_times[1] - recs[0].chunk_times[0]) * 1000)


def test_usage_absent_counts_with_the_tokenizer_or_chunks(scripted_server, word_tokenizer):
    recs, _ = _run(scripted_server.url, [("nousage", 3)], tokenizer=word_tokenizer)
    assert recs[0].ok and recs[0].output_tokens == 3 and recs[0].output_tokens_source == "tokenizer"
    assert recs[0].prompt_len == 3  # the dataset's count, since the server sent no usage
    recs, _ = _run(scripted_server.url, [("nousage", 3)])
    assert recs[0].output_tokens == 3 and recs[0].output_tokens_source == "chunks"


def test_failures_are_counted_with_their_messages_and_never_stop_the_run(scripted_server):
    prompts = [("ok", 2), ("fail", 2), ("malformed", 2), ("nodone", 2), ("streamerror", 2), ("slow", 2)]
    recs, state = _run(scripted_server.url, prompts, timeout=1.0)
    assert recs[0].ok
    assert "HTTP 500" in recs[1].error and "scripted failure" in recs[1].error
    assert "malformed stream" in recs[2].error and "not JSON" in recs[2].error
    assert "without [DONE]" in recs[3].error
    assert "scripted stream error" in recs[4].error
    assert "timed out after 1 s" in recs[5].error
    m = compute_metrics(list(recs.values()), 1.0, state.bench_start, [50])
    assert (m["completed"], m["failed"]) == (1, 5)
    assert {e["index"] for e in m["errors"]} == {1, 2, 3, 4, 5}
    assert m["total_output_tokens"] == 2  # failed requests contribute nothing


def test_max_concurrency_is_never_exceeded(scripted_server):
    recs, _ = _run(scripted_server.url, [("ok", 2)] * 9, max_concurrency=3)
    assert all(r.ok for r in recs.values())
    assert scripted_server.peak_in_flight == 3


def test_unlimited_concurrency_sends_all_at_once(scripted_server):
    _run(scripted_server.url, [("ok", 2)] * 6)
    assert scripted_server.peak_in_flight == 6


def test_arrival_offsets_are_honoured(scripted_server):
    cfg = BackendConfig(base_url=scripted_server.url, model="scripted-model")
    reqs = [SampleRequest("ok", 3, 1)] * 3
    traffic = TrafficConfig([0.0, 0.3, 0.6], None, 0)
    state = asyncio.run(run_benchmark(cfg, reqs, traffic, RunState()))
    starts = {r.index: r.start - state.bench_start for r in state.records}
    assert 0.3 <= starts[1] < 0.3 + SLACK and 0.6 <= starts[2] < 0.6 + SLACK


def test_wait_ready_lists_models_and_unreachable_server_is_one_clear_error(scripted_server):
    assert wait_ready(scripted_server.url, {}, 1.0) == ["scripted-model"]
    sleeps = []
    with pytest.raises(ServerNotReady, match=r"not ready after 0.6 s \(--ready-timeout\)"):
        wait_ready(f"http://127.0.0.1:{free_port()}", {}, 0.6, sleep=sleeps.append)
    assert sleeps  # it polled more than once before giving up
    assert math.isclose(sum(sleeps) / len(sleeps), 0.5)


def test_wait_ready_waits_while_health_says_the_server_is_still_loading(scripted_server):
    scripted_server.loading_polls = 3
    sleeps = []
    assert wait_ready(scripted_server.url, {}, 30.0, sleep=sleeps.append) == ["scripted-model"]
    assert len(sleeps) == 3 and scripted_server.loading_polls == 0
