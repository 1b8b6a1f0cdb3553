"""vLLM's metric names on /metrics: every series vLLM's Grafana dashboard queries
(vllm_grafana_series.txt, taken from the dashboard's PromQL) exists after traffic, labelled
model_name (the served name) as vLLM labels it, with counts and token totals equal to what the test
sent (the openai SDK's usage); the quantities fd does not measure are absent, not zero."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

SERIES = [ln for ln in (Path(__file__).parent / "vllm_grafana_series.txt").read_text().splitlines()]
EXPORTED = [ln for ln in SERIES if ln and not ln.startswith(("#", "!"))]
ABSENT = [ln[1:].strip() for ln in SERIES if ln.startswith("!")]


def scrape(srv) -> list:
    import httpx

    text = httpx.get(f"{srv.url}/metrics", headers=srv.headers, timeout=10).text
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples]


def total(samples, name: str, **labels) -> float:
    return sum(s.value for s in samples if s.name == name and labels.items() <= s.labels.items())


def send(srv) -> list:
    """Three requests: two completions (one cut by max_tokens), one streamed chat; their usages."""
    client = srv.client()
    usages, reasons = [], []
    for i, max_tokens in enumerate((1, 7)):
        r = client.completions.create(model="tiny", prompt=f"vllm metrics probe {i}", max_tokens=max_tokens)
        usages.append(r.usage)
        reasons.append(r.choices[0].finish_reason)
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "metrics probe chat"}],
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].finish_reason:
            reasons.append(chunk.choices[0].finish_reason)
        if chunk.usage:
            usages.append(chunk.usage)
    return usages, reasons


def test_dashboard_series_exist_with_the_values_sent(server):
    before = scrape(server)
    usages, reasons = send(server)
    after = scrape(server)
    names = {s.name for s in after}
    assert not [n for n in EXPORTED if n not in names]
    assert not [n for n in ABSENT if n in names]
    for s in after:
        if s.name.startswith("vllm:"):
            assert s.labels.get("model_name") == "tiny", s

    def delta(name, **labels):
        return total(after, name, **labels) - total(before, name, **labels)

    prompt = sum(u.prompt_tokens for u in usages)
    generated = sum(u.completion_tokens for u in usages)
    assert delta("vllm:prompt_tokens_total") == prompt == delta("fd:prompt_tokens_total")
    assert delta("vllm:generation_tokens_total") == generated == delta("fd:generation_tokens_total")
    assert delta("vllm:request_prompt_tokens_sum") == prompt
    assert delta("vllm:request_generation_tokens_sum") == generated
    assert delta("vllm:request_success_total") == 3
    for reason in set(reasons):
        assert delta("vllm:request_success_total", finished_reason=reason) == reasons.count(reason)
    for hist in ("e2e_request_latency_seconds", "time_to_first_token_seconds", "request_prompt_tokens"):
        assert delta(f"vllm:{hist}_count") == 3
        assert delta(f"vllm:{hist}_bucket", le="+Inf") == 3
    # Per-request TPOT needs two tokens: the max_tokens=1 request is not observed (fd's own twin alike).
    assert delta("vllm:request_time_per_output_token_seconds_count") == 2
    assert delta("fd:time_per_output_token_seconds_count") == 2
    assert delta("vllm:e2e_request_latency_seconds_sum") == delta("fd:e2e_request_latency_seconds_sum")
    # One inter-token gap per engine step after a request's first; each step of this tiny model's
    # one-token-at-a-time decode brings one token, so the gaps are the tokens after each first one.
    assert delta("vllm:inter_token_latency_seconds_count") == sum(u.completion_tokens - 1 for u in usages)


def test_buckets_are_vllms(server):
    """vLLM's bounds (loggers.py): TTFT from 0.001 to 2560 s, request latency 0.3 to 7680 s, token
    counts 1-2-5 up to max_model_len; engine families labelled engine="0" with one engine core."""
    samples = scrape(server)
    bounds = lambda n: [s.labels["le"] for s in samples if s.name == n]  # noqa: E731
    assert bounds("vllm:time_to_first_token_seconds_bucket")[:2] == ["0.001", "0.005"]
    assert bounds("vllm:time_to_first_token_seconds_bucket")[-2:] == ["2560.0", "+Inf"]
    assert bounds("vllm:e2e_request_latency_seconds_bucket")[-2:] == ["7680.0", "+Inf"]
    assert bounds("vllm:request_prompt_tokens_bucket")[:4] == ["1.0", "2.0", "5.0", "10.0"]
    running = [s for s in samples if s.name == "vllm:num_requests_running"]
    assert [s.labels for s in running] == [{"model_name": "tiny", "engine": "0"}]


def test_engine_phases_count_every_request_and_add_up(server):
    """vLLM's engine-phase histograms (vllm/v1/metrics/stats.py): one observation per request sent, and
    the sums keep vLLM's definitions: prefill + decode = inference (queue ends where inference starts),
    both inside e2e (the core's events fall between the front end's arrival and finish, on one clock),
    the inter-token gaps add up to the decode time, and the prefill KV tokens are the prompt tokens the
    prefix cache did not supply."""
    before = scrape(server)
    usages, _ = send(server)
    after = scrape(server)

    def delta(name, **labels):
        return total(after, name, **labels) - total(before, name, **labels)

    phases = ("queue", "prefill", "decode", "inference")
    for hist in [f"request_{p}_time_seconds" for p in phases] + ["request_prefill_kv_computed_tokens"]:
        assert delta(f"vllm:{hist}_count") == len(usages) == 3, hist
        assert delta(f"vllm:{hist}_bucket", le="+Inf") == 3, hist
    queue, prefill, decode, inference = (delta(f"vllm:request_{p}_time_seconds_sum") for p in phases)
    assert min(queue, prefill, decode, inference) >= 0
    assert prefill + decode == pytest.approx(inference, abs=1e-9)
    assert queue + inference <= delta("vllm:e2e_request_latency_seconds_sum")
    assert delta("vllm:inter_token_latency_seconds_sum") == pytest.approx(decode, abs=1e-9)
    prompt = sum(u.prompt_tokens for u in usages)
    computed = prompt - delta("fd:prefix_cache_hits_total")
    assert delta("vllm:request_prefill_kv_computed_tokens_sum") == computed
