"""vLLM's metric names on fd's /metrics (vllm/v1/metrics/loggers.py PrometheusStatLogger), so that a
vLLM Grafana dashboard or alert rule works unchanged. Every family here is fed by the measurement that
feeds its fd: twin (the same stats snapshot, the same observation), never by a second bookkeeping.

Labels as vLLM's: engine families (read from the core's stats) carry model_name and engine (the
data-parallel rank; "0" with one engine core); the front end's request histograms carry model_name
only, since the front end does not know which rank served a request. Quantities fd does not measure
are absent, not zero (docs/metrics.md)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from fdcli_engine.core.token_stats import ITERATION_TOKENS_BUCKETS

# vLLM's bucket bounds, as loggers.py defines them.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5)
TTFT_BUCKETS += (10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5)
TPOT_BUCKETS += (10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0)
REQUEST_LATENCY_BUCKETS += (50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
N_BUCKETS = (1, 2, 5, 10, 20)
FINISH_REASONS = ("stop", "length", "abort")  # fd's finish reasons; each series exists from the start

# vLLM gauge -> (help, stats key); vLLM counter (without _total) -> (help, stats key).
ENGINE_GAUGES = {
    "vllm:num_requests_running": ("Number of requests in model execution batches.", "num_running"),
    "vllm:num_requests_waiting": ("Number of requests waiting to be processed.", "num_waiting"),
    "vllm:kv_cache_usage_perc": ("KV-cache usage. 1 means 100 percent usage.", "kv_cache_usage"),
}
ENGINE_COUNTERS = {
    "vllm:prompt_tokens": ("Number of prefill tokens processed.", "prompt_tokens_total"),
    "vllm:generation_tokens": ("Number of generation tokens processed.", "generation_tokens_total"),
    "vllm:prefix_cache_queries": (
        "Prefix cache queries, in terms of number of queried tokens.",
        "prefix_cache_queries",
    ),
    "vllm:prefix_cache_hits": (
        "Prefix cache hits, in terms of number of cached tokens.",
        "prefix_cache_hits",
    ),
    "vllm:num_preemptions": ("Cumulative number of preemption from the engine.", "num_preemptions"),
    "vllm:prompt_tokens_cached": (
        "Number of cached prompt tokens (local + external).",
        "prompt_tokens_cached",
    ),
    "vllm:prompt_tokens_recomputed": (
        "Number of cached tokens recomputed for forward pass.",
        "prompt_tokens_recomputed",
    ),
}
# With a KV connector only (the stats carry them only then): vLLM counter -> (help, stats key).
EXTERNAL_PREFIX_CACHE_COUNTERS = {
    "vllm:external_prefix_cache_queries": (
        "External prefix cache queries from KV connector cross-instance cache sharing, "
        "in terms of number of queried tokens.",
        "external_prefix_cache_queries",
    ),
    "vllm:external_prefix_cache_hits": (
        "External prefix cache hits from KV connector cross-instance cache sharing, "
        "in terms of number of cached tokens.",
        "external_prefix_cache_hits",
    ),
}
# With speculative decoding only (vllm/v1/spec_decode/metrics.py SpecDecodingProm; the stats carry
# them only then): vLLM counter -> (help, stats key), the twins of fd's spec_decode counters.
SPEC_DECODE_COUNTERS = {
    "vllm:spec_decode_num_drafts": ("Number of spec decoding drafts.", "spec_decode_num_drafts"),
    "vllm:spec_decode_num_draft_tokens": ("Number of draft tokens.", "spec_decode_num_draft_tokens_total"),
    "vllm:spec_decode_num_accepted_tokens": (
        "Number of accepted tokens.",
        "spec_decode_num_accepted_tokens_total",
    ),
}
# vllm:prompt_tokens_by_source's source label -> stats key (vLLM's PromptTokenStats.ALL_SOURCES).
PROMPT_TOKEN_SOURCES = {
    "local_compute": "prompt_tokens_local_compute",
    "local_cache_hit": "prompt_tokens_local_cache_hit",
    "external_kv_transfer": "prompt_tokens_external_kv_transfer",
}


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """vLLM's token-count buckets: 1, 2, 5, 10, 20, 50, ... up to max_value."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return out
            out.append(m * scale)
        scale *= 10


def engine_families(s: dict, model_name: str):
    """vLLM's engine gauges and counters from one stats snapshot: one sample per engine (per live
    data-parallel rank, from the snapshot's "ranks"; engine="0" without data parallelism)."""
    per_engine = s.get("ranks") or {"0": s}
    engines = sorted(per_engine.items(), key=lambda kv: int(kv[0]))
    tables = [(GaugeMetricFamily, ENGINE_GAUGES), (CounterMetricFamily, ENGINE_COUNTERS)]
    if "external_prefix_cache_queries" in s:
        tables.append((CounterMetricFamily, EXTERNAL_PREFIX_CACHE_COUNTERS))
    if "spec_decode_num_draft_tokens_total" in s:
        tables.append((CounterMetricFamily, SPEC_DECODE_COUNTERS))
    for family, table in tables:
        for name, (doc, key) in table.items():
            f = family(name, doc, labels=["model_name", "engine"])
            for engine, stats in engines:
                f.add_metric([model_name, engine], float(stats.get(key) or 0))
            yield f
    by_source = CounterMetricFamily(
        "vllm:prompt_tokens_by_source",
        "Number of prompt tokens by source.",
        labels=["model_name", "engine", "source"],
    )
    for engine, stats in engines:
        for source, key in PROMPT_TOKEN_SOURCES.items():
            by_source.add_metric([model_name, engine, source], float(stats.get(key) or 0))
    yield by_source
    yield iteration_tokens(engines, model_name)
    if "spec_decode_num_draft_tokens_total" in s:
        per_pos = CounterMetricFamily(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            labels=["model_name", "engine", "position"],
        )
        for engine, stats in engines:
            for pos, n in enumerate(stats.get("spec_decode_num_accepted_tokens_per_pos") or []):
                per_pos.add_metric([model_name, engine, str(pos)], float(n))
        yield per_pos


def iteration_tokens(engines, model_name: str) -> HistogramMetricFamily:
    """vllm:iteration_tokens_total from the core's per-bucket step counts (core/token_stats.py)."""
    h = HistogramMetricFamily(
        "vllm:iteration_tokens_total",
        "Histogram of number of tokens per engine_step.",
        labels=["model_name", "engine"],
    )
    bounds = [floatToGoString(b) for b in ITERATION_TOKENS_BUCKETS] + ["+Inf"]
    for engine, stats in engines:
        counts = list(stats.get("iteration_tokens_buckets") or [])
        counts += [0] * (len(bounds) - len(counts))
        cumulative, running = [], 0
        for bound, n in zip(bounds, counts):
            running += n
            cumulative.append((bound, float(running)))
        h.add_metric([model_name, engine], cumulative, float(stats.get("iteration_tokens_sum") or 0))
    return h


class RequestFamilies:
    """vLLM's per-request histograms and request_success, labelled model_name."""

    def __init__(self, registry, model_name: str, max_model_len: int):
        def hist(name, doc, buckets):
            h = Histogram(name, doc, ["model_name"], buckets=buckets, registry=registry)
            return h.labels(model_name)

        tokens = build_1_2_5_buckets(max_model_len)
        self.ttft = hist(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        )
        self.tpot = hist(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            TPOT_BUCKETS,
        )
        self.itl = hist(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", TPOT_BUCKETS
        )
        self.e2e = hist(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )
        # The engine core's phases of a request (RequestMetrics' intervals, vLLM's definitions).
        self.queue = hist(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.prefill = hist(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.decode = hist(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.inference = hist(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.prefill_kv_computed = hist(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            tokens,
        )
        # The request's parameters: max_tokens per sequence, n (and the most tokens one of its n
        # sequences generated) per request, as vLLM's ParentRequest observes them.
        self.max_tokens = hist(
            "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", tokens
        )
        self.n = hist("vllm:request_params_n", "Histogram of the n request parameter.", N_BUCKETS)
        self.max_generation_tokens = hist(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            tokens,
        )
        self.prompt_tokens = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens)
        self.generation_tokens = hist(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", tokens
        )
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            ["model_name", "finished_reason"],
            registry=registry,
        )
        self.success = {r: success.labels(model_name, r) for r in FINISH_REASONS}
