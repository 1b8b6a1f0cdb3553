"""Prometheus metrics of the server: engine gauges/counters read from the core's get_stats() at scrape
time, and per-request histograms observed in the front end from each finished request's RequestMetrics
(the front end's times: TTFT, end-to-end; the engine core's: queue, prefill, decode, inference, TPOT),
the request's parameters (max_tokens per sequence; n once per request, ParentRequest) and the HTTP
admission wait.
Each quantity is also exported under vLLM's name (vllm_metrics.py), fed by the same snapshot or
observation.

Speculative decoding's metrics (spec_decode_metrics) exist only when the engine runs with
--speculative-config: the core's stats carry their keys only then, and a metric absent from /metrics
says "no speculation" more plainly than a zero would."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from fdcli_engine.entrypoints.openai.vllm_metrics import RequestFamilies, engine_families

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class _EngineCollector:
    """Turns the last stats snapshot into metric families (refreshed just before each scrape)."""

    def __init__(self, model_name: str) -> None:
        self.stats: dict = {}
        self.num_http_inflight = 0
        self.model_name = model_name

    def collect(self):
        s = self.stats
        yield from engine_gauges(s)
        yield from engine_families(s, self.model_name)
        g = GaugeMetricFamily("fd:num_requests_inflight", "Requests the HTTP front end is serving")
        g.add_metric([], float(self.num_http_inflight or 0))
        yield g
        yield _ratio(
            "fd:prefix_cache_hit_rate",
            "Prefix-cache hits / queries since start (tokens)",
            s.get("prefix_cache_hits"),
            s.get("prefix_cache_queries"),
        )
        counters = {
            "fd:prompt_tokens": ("Prompt tokens processed", "prompt_tokens_total"),
            "fd:generation_tokens": ("Tokens generated", "generation_tokens_total"),
            "fd:prefix_cache_queries": ("Prefix-cache queries (tokens)", "prefix_cache_queries"),
            "fd:prefix_cache_hits": ("Prefix-cache hits (tokens)", "prefix_cache_hits"),
            "fd:num_preemptions": ("Requests preempted by the scheduler", "num_preemptions"),
            # Structured outputs, the engine core's grammar backend (absent until its first constraint).
            "fd:grammar_compiles": (
                "Constraints compiled by the engine's grammar backend",
                "grammar_compiles",
            ),
            "fd:grammar_cache_hits": (
                "Constraints found compiled in the grammar cache",
                "grammar_cache_hits",
            ),
            "fd:grammar_compile_errors": (
                "Constraints the grammar backend refused",
                "grammar_compile_errors",
            ),
            "fd:grammar_compile_seconds": ("Seconds spent compiling constraints", "grammar_compile_seconds"),
        }
        for name, (doc, key) in counters.items():
            yield _counter(name, doc, s.get(key))
        yield from spec_decode_metrics(s)
        for key, doc in _KV_TRANSFER_COUNTERS.items():  # prefill/decode instances only (kv_transfer/pd)
            if key in s:
                yield _counter(f"fd:{key}", doc, s[key])
        yield from kv_offload_metrics(s)


_KV_TRANSFER_COUNTERS = {
    "kv_transfer_sent": "Prompts whose KV blocks this prefill instance sent",
    "kv_transfer_send_failures": "KV transfers this prefill instance could not send",
    "kv_transfer_loaded_blocks": "KV blocks this decode instance loaded from prefill instances",
    "kv_transfer_recomputed": "Requests this decode instance recomputed instead of loading their transfer",
    "kv_transfer_timeouts": "Transfers this decode instance waited for in vain (FD_KV_TRANSFER_TIMEOUT)",
}

_ENGINE_GAUGES = {
    "fd:num_requests_running": ("Requests the engine is running", "num_running"),
    "fd:num_requests_waiting": ("Requests waiting in the engine's queue", "num_waiting"),
    "fd:kv_cache_usage_perc": ("Fraction of KV-cache blocks in use (0..1)", "kv_cache_usage"),
}


def engine_gauges(s: dict):
    """The engine's gauges: unlabelled for one engine core; with data parallelism (the stats carry
    "ranks", api/dp_stats.py) one sample per live rank, labelled rank="N", and
    fd:data_parallel_rank_alive (1 live, 0 dead) for every rank. Counters stay unlabelled sums."""
    ranks = s.get("ranks")
    for name, (doc, key) in _ENGINE_GAUGES.items():
        if ranks is None:
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], float(s.get(key) or 0))
        else:
            g = GaugeMetricFamily(name, doc, labels=["rank"])
            for rank, stats in sorted(ranks.items(), key=lambda kv: int(kv[0])):
                g.add_metric([rank], float(stats.get(key) or 0))
        yield g
    if ranks is not None:
        alive = GaugeMetricFamily(
            "fd:data_parallel_rank_alive",
            "1 while the data-parallel rank serves, 0 once it died",
            labels=["rank"],
        )
        states = {int(r): 1.0 for r in ranks} | {int(r): 0.0 for r in s.get("dead_ranks", [])}
        for rank in sorted(states):
            alive.add_metric([str(rank)], states[rank])
        yield alive


def _counter(name: str, doc: str, value) -> CounterMetricFamily:
    c = CounterMetricFamily(name, doc)
    c.add_metric([], float(value or 0))
    return c


def _ratio(name: str, doc: str, part, whole) -> GaugeMetricFamily:
    """part / whole as a gauge; 0 while whole is 0 (no NaN before the first event)."""
    g = GaugeMetricFamily(name, doc)
    g.add_metric([], (part or 0) / whole if whole else 0.0)
    return g


# Speculative decoding: FastDeploy's counter names (and vLLM's num_drafts and per-position counter)
# under fd's "fd:" prefix. Stats key -> (metric name without "_total", help).
_SPEC_COUNTERS = {
    "spec_decode_num_drafts": ("fd:spec_decode_num_drafts", "Verification steps of a request with drafts"),
    "spec_decode_num_draft_tokens_total": (
        "fd:spec_decode_num_draft_tokens",
        "Draft tokens proposed and verified",
    ),
    "spec_decode_num_accepted_tokens_total": (
        "fd:spec_decode_num_accepted_tokens",
        "Draft tokens the target model accepted",
    ),
    "spec_decode_num_emitted_tokens_total": (
        "fd:spec_decode_num_emitted_tokens",
        "Tokens emitted by steps that verified drafts (accepted drafts + the target's own token)",
    ),
}


def spec_decode_metrics(s: dict):
    """The speculative-decoding families of one stats snapshot; none without speculation."""
    if "spec_decode_num_draft_tokens_total" not in s:
        return
    for key, (name, doc) in _SPEC_COUNTERS.items():
        yield _counter(name, doc, s.get(key))
    yield _ratio(
        "fd:spec_decode_draft_acceptance_rate",
        "Accepted / proposed draft tokens since start (0 before any)",
        s.get("spec_decode_num_accepted_tokens_total"),
        s.get("spec_decode_num_draft_tokens_total"),
    )
    per_pos = list(s.get("spec_decode_num_accepted_tokens_per_pos") or [])
    num_drafts = s.get("spec_decode_num_drafts", 0) or 0
    counts = CounterMetricFamily(
        "fd:spec_decode_num_accepted_tokens_per_pos",
        "Accepted draft tokens at each draft position (0: the first draft of a step)",
        labels=["position"],
    )
    rates = GaugeMetricFamily(
        "fd:spec_decode_draft_acceptance_rate_per_pos",
        "Fraction of verification steps whose draft at this position was accepted",
        labels=["position"],
    )
    for pos, n in enumerate(per_pos):
        counts.add_metric([str(pos)], float(n))
        rates.add_metric([str(pos)], n / num_drafts if num_drafts else 0.0)
    yield counts
    yield rates


def kv_offload_metrics(s: dict):
    """The KV offload tiers' families (docs/kv-offload.md): FastDeploy's prefix_cpu_cache_token_num and
    cpu_hit_token_rate, vLLM's kv_offload_total_bytes / _total_time by transfer_type; none without a
    tier."""
    if "prefix_cpu_cache_token_num" not in s:
        return
    gauges = {
        "fd:prefix_cpu_cache_token_num": (
            "Tokens whose KV blocks the memory tier holds",
            "prefix_cpu_cache_token_num",
        ),
        "fd:kv_offload_disk_cache_token_num": (
            "Tokens whose KV blocks the file tier holds",
            "kv_offload_disk_cache_token_num",
        ),
        "fd:kv_offload_cpu_cache_bytes": ("Bytes the memory tier holds", "kv_offload_cpu_cache_bytes"),
        "fd:kv_offload_disk_cache_bytes": ("Bytes the file tier holds", "kv_offload_disk_cache_bytes"),
    }
    for name, (doc, key) in gauges.items():
        g = GaugeMetricFamily(name, doc)
        g.add_metric([], float(s.get(key) or 0))
        yield g
    yield _counter(
        "fd:kv_offload_hit_tokens",
        "Prompt tokens loaded from an offload tier",
        s.get("kv_offload_hit_tokens"),
    )
    yield _ratio(
        "fd:cpu_hit_token_rate",
        "Prompt tokens loaded from an offload tier / prompt tokens looked up",
        s.get("kv_offload_hit_tokens"),
        s.get("prefix_cache_queries"),
    )
    for stem, name, doc in (
        ("kv_offload_bytes:", "fd:kv_offload_total_bytes", "Bytes of KV blocks copied between tiers"),
        ("kv_offload_seconds:", "fd:kv_offload_total_time", "Seconds spent copying KV blocks between tiers"),
    ):
        c = CounterMetricFamily(name, doc, labels=["transfer_type"])
        for key, value in s.items():
            if key.startswith(stem):
                c.add_metric([key[len(stem) :]], float(value or 0))
        yield c


class ServerMetrics:
    """`model_name`: the first served model name (vLLM's model_name label); `max_model_len` bounds
    vLLM's token-count buckets."""

    def __init__(self, model_name: str, max_model_len: int) -> None:
        self.registry = CollectorRegistry()
        self.engine = _EngineCollector(model_name)
        self.registry.register(self.engine)
        h = {"buckets": _LATENCY_BUCKETS, "registry": self.registry}
        self.ttft = Histogram("fd:time_to_first_token_seconds", "Time to first token", **h)
        self.tpot = Histogram(
            "fd:time_per_output_token_seconds", "Mean time per output token after the first", **h
        )
        self.e2e = Histogram("fd:e2e_request_latency_seconds", "End-to-end request latency", **h)
        self.queue = Histogram("fd:request_queue_time_seconds", "Time a request waited for admission", **h)
        self.vllm = RequestFamilies(self.registry, model_name, max_model_len)

    def render(self, stats: dict | None) -> bytes:
        if stats is not None:
            self.engine.stats = stats
        return generate_latest(self.registry)


class ObservedEngine:
    """An EngineClient wrapper that times every generated sequence; everything else passes through."""

    def __init__(self, engine, metrics: ServerMetrics):
        self._engine = engine
        self._metrics = metrics

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def generate(self, prompt_token_ids, params, request_id, prompt=None, **kwargs):
        """A sequence of its own: a request with n = 1."""
        return self.parallel_sampling(1).generate(prompt_token_ids, params, request_id, prompt, **kwargs)

    def parallel_sampling(self, n: int) -> ParentRequest:
        """The engine of one request's `n` sequences (serving_common.merge_jobs), observed as one request."""
        return ParentRequest(self, n)

    async def _generate(self, parent: ParentRequest, prompt_token_ids, params, request_id, prompt, **kwargs):
        """Times come from the finished output's `metrics` (the front end's clock), so a FINAL_ONLY
        request, which yields once, is timed as a streamed one is. `kwargs`: the images (mm_features)."""
        try:
            async for out in self._engine.generate(prompt_token_ids, params, request_id, prompt, **kwargs):
                if out.finished and out.metrics is not None:
                    self._observe(out, params)
                    parent.finished(out.metrics.num_generation_tokens)
                yield out
        finally:
            parent.ended()

    def _observe(self, out, params) -> None:
        """One observation per quantity, handed to its fd: and its vllm: family alike. The engine's
        phases are RequestMetrics' intervals: queue time once the request was scheduled, the others
        once it had a token (a request aborted before either is in e2e only)."""
        m, fd, vllm = out.metrics, self._metrics, self._metrics.vllm
        e2e = m.finished_time - m.arrival_time
        fd.e2e.observe(e2e)
        vllm.e2e.observe(e2e)
        if params.max_tokens:  # the limit the serving layer set: the request's, within the context's room
            vllm.max_tokens.observe(params.max_tokens)
        num_prompt_tokens = len(out.prompt_token_ids)
        vllm.prompt_tokens.observe(num_prompt_tokens)
        vllm.generation_tokens.observe(m.num_generation_tokens)
        reason = out.outputs[0].finish_reason
        if reason in vllm.success:
            vllm.success[reason].inc()
        if m.queued_time is not None:
            vllm.queue.observe(m.queued_time)
            vllm.prefill_kv_computed.observe(num_prompt_tokens - out.num_cached_tokens)
        if m.first_token_time is None:
            return
        ttft = m.first_token_time - m.arrival_time
        fd.ttft.observe(ttft)
        vllm.ttft.observe(ttft)
        for gap in m.inter_token_latencies:
            vllm.itl.observe(gap)
        if m.inference_time is None:  # tokens without the core's times (unstamped outputs): no phases
            return
        decode = m.decode_time
        vllm.prefill.observe(m.prefill_time)
        vllm.decode.observe(decode)
        vllm.inference.observe(m.inference_time)
        if m.num_generation_tokens > 1:
            tpot = decode / (m.num_generation_tokens - 1)
            fd.tpot.observe(tpot)
            vllm.tpot.observe(tpot)


class ParentRequest:
    """One request's n sequences as vLLM's ParentRequest counts them for its metrics: once the last of
    them has ended, vllm:request_params_n observes n and vllm:request_max_num_generation_tokens the most
    tokens one of them generated, if any of them finished (a request whose client left before any
    finished is not observed, as in the per-sequence families)."""

    def __init__(self, engine: ObservedEngine, n: int):
        self._engine = engine
        self.n = n
        self._running = n
        self._max_generated: int | None = None

    def generate(self, prompt_token_ids, params, request_id, prompt=None, **kwargs):
        return self._engine._generate(self, prompt_token_ids, params, request_id, prompt, **kwargs)

    def finished(self, num_generation_tokens: int) -> None:
        self._max_generated = max(self._max_generated or 0, num_generation_tokens)

    def ended(self) -> None:
        self._running -= 1
        if self._running == 0 and self._max_generated is not None:
            vllm = self._engine._metrics.vllm
            vllm.n.observe(self.n)
            vllm.max_generation_tokens.observe(self._max_generated)
