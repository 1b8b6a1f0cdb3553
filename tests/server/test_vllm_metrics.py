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


def test_request_params_count_each_request_once(server):
    """vLLM's request-parameter histograms (loggers.py, parallel_sampling.ParentRequest): max_tokens
    once per sequence; n, and the most tokens one of a request's n sequences generated, once per
    request (a completion with a list of prompts is one request per prompt, as vLLM makes it)."""
    client = server.client()
    before = scrape(server)
    sent = []  # (n, max_tokens) per request
    no_eos = {"ignore_eos": True}  # every sequence generates max_tokens, which usage confirms
    r = client.completions.create(model="tiny", prompt="params n three", n=3, max_tokens=4, extra_body=no_eos)
    assert r.usage.completion_tokens == 3 * 4
    sent.append((3, 4))
    r = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "params n two"}],
        n=2,
        max_tokens=6,
        extra_body=no_eos,
    )
    assert r.usage.completion_tokens == 2 * 6
    sent.append((2, 6))
    r = client.completions.create(
        model="tiny", prompt=["params list one", "params list two"], n=2, max_tokens=3, extra_body=no_eos
    )
    assert r.usage.completion_tokens == 2 * 2 * 3
    sent += [(2, 3), (2, 3)]
    r = client.completions.create(model="tiny", prompt="params single", max_tokens=5, extra_body=no_eos)
    assert r.usage.completion_tokens == 5
    sent.append((1, 5))
    after = scrape(server)

    def delta(name, **labels):
        return total(after, name, **labels) - total(before, name, **labels)

    assert delta("vllm:request_params_n_count") == len(sent)
    assert delta("vllm:request_params_n_sum") == sum(n for n, _ in sent)
    for le in ("1.0", "2.0", "5.0"):
        assert delta("vllm:request_params_n_bucket", le=le) == sum(n <= float(le) for n, _ in sent)
    assert delta("vllm:request_max_num_generation_tokens_count") == len(sent)
    assert delta("vllm:request_max_num_generation_tokens_sum") == sum(m for _, m in sent)
    assert delta("vllm:request_params_max_tokens_count") == sum(n for n, _ in sent)
    assert delta("vllm:request_params_max_tokens_sum") == sum(n * m for n, m in sent)
    assert delta("vllm:request_success_total") == sum(n for n, _ in sent)


def test_prompt_tokens_by_source_follow_the_prefix_cache(server):
    """vLLM's prompt-source counters (stats.py PromptTokenStats) over a prompt sent twice: the second
    time the prefix cache holds all of it, yet its last block is computed again (one token must be, for
    the logits, and hits are whole blocks): those tokens count as cached in local_cache_hit and as
    recomputed. A prompt one token longer reuses every block and recomputes nothing. The sources add up
    to the prompt tokens as vLLM's invariant says, and cached = the prefix cache's hits (no connector)."""
    client = server.client()
    ids = [100 + (7 * i) % 151 for i in range(64)]  # 64 tokens: whole blocks for any block size <= 64
    samples = [scrape(server)]
    for prompt in (ids, ids, ids + [42]):
        r = client.completions.create(model="tiny", prompt=prompt, max_tokens=1)
        assert r.usage.prompt_tokens == len(prompt)
        samples.append(scrape(server))

    def delta(i, name, **labels):
        return total(samples[i + 1], name, **labels) - total(samples[i], name, **labels)

    def source(i, s):
        return delta(i, "vllm:prompt_tokens_by_source_total", source=s)

    for i, prompt in enumerate((ids, ids, ids + [42])):
        hits = delta(i, "vllm:prefix_cache_hits_total")
        recomputed = delta(i, "vllm:prompt_tokens_recomputed_total")
        assert delta(i, "vllm:prompt_tokens_total") == len(prompt)
        assert delta(i, "vllm:prompt_tokens_cached_total") == hits
        assert source(i, "external_kv_transfer") == 0
        assert source(i, "local_cache_hit") == hits + recomputed
        assert source(i, "local_compute") == len(prompt) - hits
        parts = sum(source(i, s) for s in ("local_compute", "local_cache_hit", "external_kv_transfer"))
        assert parts - recomputed == len(prompt)
    assert (delta(0, "vllm:prefix_cache_hits_total"), delta(0, "vllm:prompt_tokens_recomputed_total")) == (
        0,
        0,
    )
    # Second: every token cached; the last block's tokens computed again.
    recomputed = delta(1, "vllm:prompt_tokens_recomputed_total")
    assert recomputed > 0 and delta(1, "vllm:prefix_cache_hits_total") == len(ids) - recomputed
    assert source(1, "local_cache_hit") == len(ids)
    # Third: all 64 cached tokens reused, only the new one computed.
    assert delta(2, "vllm:prefix_cache_hits_total") == len(ids)
    assert delta(2, "vllm:prompt_tokens_recomputed_total") == 0
    assert source(2, "local_compute") == 1


def test_iteration_tokens_count_each_step(server):
    """vllm:iteration_tokens_total: one observation per engine step, of the prompt tokens it counted and
    the tokens it generated, so its sum is prompt + generated tokens. Requests sent one at a time, each
    prompt taken in one step: the first step of each brings the prompt and one token, every later step
    one token, so the steps are the generated tokens and those holding one token all but the first."""
    client = server.client()
    before = scrape(server)
    usages = []
    for i, max_tokens in enumerate((1, 4, 9)):
        r = client.completions.create(
            model="tiny",
            prompt=f"iteration probe {i}",
            max_tokens=max_tokens,
            extra_body={"ignore_eos": True},
        )
        usages.append(r.usage)
    after = scrape(server)

    def delta(name, **labels):
        return total(after, name, **labels) - total(before, name, **labels)

    prompt = sum(u.prompt_tokens for u in usages)
    generated = sum(u.completion_tokens for u in usages)
    assert generated == 1 + 4 + 9
    assert delta("vllm:iteration_tokens_total_sum") == prompt + generated
    assert delta("vllm:iteration_tokens_total_count") == generated
    assert delta("vllm:iteration_tokens_total_bucket", le="+Inf") == generated
    assert delta("vllm:iteration_tokens_total_bucket", le="1.0") == generated - len(usages)
    buckets = [s for s in after if s.name == "vllm:iteration_tokens_total_bucket"]
    assert [s.labels["le"] for s in buckets][:3] == ["1.0", "8.0", "16.0"]
    assert {s.labels["engine"] for s in buckets} == {"0"}


# vLLM families whose quantity fd's engine does not have (docs/metrics.md): absent, never zero.
NOT_MEASURED = (
    "vllm:corrupted_requests_total",
    "vllm:engine_sleep_state",
    "vllm:lora_requests_info",
    "vllm:mm_cache_queries_total",
    "vllm:mm_cache_hits_total",
)


# Measured with a KV connector only (tests/server/test_kv_offload_serve.py): absent without one.
CONNECTOR_ONLY = ("vllm:external_prefix_cache_queries_total", "vllm:external_prefix_cache_hits_total")


def test_unmeasured_families_are_absent(server):
    names = {s.name for s in scrape(server)}
    assert not [n for n in NOT_MEASURED + CONNECTOR_ONLY if n in names]


def test_spec_decode_counters_under_vllms_names(tiny_model, tmp_path):
    """With speculation on, vLLM's spec_decode counters (SpecDecodingProm, labelled engine and, per
    draft position, position) are fd's counters under vLLM's names: one measurement for both; the
    accepted drafts by position add up to the accepted ones, and each verification drafted at most
    num_speculative_tokens."""
    from server.fd_server import start_server

    spec = '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3, "prompt_lookup_min": 1}'
    srv = start_server(tiny_model, tmp_path, "--served-model-name", "tiny", "--speculative-config", spec)
    try:
        r = srv.client().completions.create(
            model="tiny",
            prompt="one two three one two three one two three one two",
            max_tokens=24,
            temperature=0,
        )
        assert r.usage.completion_tokens > 0
        m = srv.metrics()
    finally:
        assert srv.stop() == 0, srv.log.read_text()[-3000:]
    labels = '{engine="0",model_name="tiny"}'
    drafts = m[f"vllm:spec_decode_num_drafts_total{labels}"]
    accepted = m[f"vllm:spec_decode_num_accepted_tokens_total{labels}"]
    assert drafts == m["fd:spec_decode_num_drafts_total"] > 0
    assert m[f"vllm:spec_decode_num_draft_tokens_total{labels}"] == m["fd:spec_decode_num_draft_tokens_total"]
    assert drafts <= m[f"vllm:spec_decode_num_draft_tokens_total{labels}"] <= 2 * drafts
    assert accepted == m["fd:spec_decode_num_accepted_tokens_total"]
    per_pos = [
        m[
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="tiny",position="{p}"}}'
        ]
        for p in (0, 1)
    ]
    assert sum(per_pos) == accepted and per_pos[0] >= per_pos[1]
