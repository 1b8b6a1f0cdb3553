"""vLLM's result-file keys and file name for `fd bench serve --save-result`.

`vllm bench serve --save-result` writes one flat JSON object (date, backend, label, model_id, ...,
mean_ttft_ms, p99_ttft_ms, ...) named `{label}-{request_rate}qps[-concurrencyN]-{model}-{date}.json`;
vLLM's plotting and comparison scripts read those keys. fd writes the same keys at the top level of
its own result file (next to `schema`, `config` and `metrics`), with vLLM's units: seconds in the
per-request lists (ttfts, itls), milliseconds in the summaries. Per-request lists only with
--save-detailed, as vLLM does.
"""

from __future__ import annotations

import math
import re

from fdcli.bench.metrics import LATENCY_METRICS, RequestRecord, itl_mode, percentile_label, request_itls
from fdcli_engine.errors import ConfigError

DATE_FORMAT = "%Y%m%d-%H%M%S"
# Keys of fd's own result layout: --metadata may not overwrite them.
RESERVED_KEYS = ("schema", "kind", "fd_version", "config", "metrics", "requests")


def parse_metadata(items: list[str] | None) -> dict[str, str]:
    """`KEY=VALUE` pairs, as vLLM's --metadata (keys and values stripped)."""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--metadata {item!r}: expected KEY=VALUE, e.g. --metadata version=0.3.3 tp=1")
        if key in RESERVED_KEYS:
            raise ConfigError(f"--metadata {key!r}: that key holds fd's own results; choose another name")
        out[key] = value.strip()
    return out


def parse_percentile_metrics(spec: str) -> list[str]:
    names = [n.strip() for n in spec.split(",") if n.strip()]
    bad = [n for n in names if n not in LATENCY_METRICS]
    if not names or bad:
        raise ConfigError(
            f"--percentile-metrics {spec!r}: use a comma-separated subset of {','.join(LATENCY_METRICS)}"
        )
    return names


def _rate_word(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:g}"


def default_result_filename(
    label: str,
    request_rate: float,
    max_concurrency: int | None,
    model_id: str,
    date: str,
    ramp_up: str | None = None,
    ramp_up_start_rate: float | None = None,
    ramp_up_end_rate: float | None = None,
) -> str:
    """vLLM's name: `{label}-{rate}qps[-concurrency{N}]-{model basename}-{date}.json`."""
    conc = f"-concurrency{max_concurrency}" if max_concurrency is not None else ""
    base = model_id.rstrip("/").split("/")[-1]
    if ramp_up is not None:
        start, end = _rate_word(ramp_up_start_rate or 0.0), _rate_word(ramp_up_end_rate or 0.0)
        return f"{label}-ramp-up-{ramp_up}-{start}qps-{end}qps{conc}-{base}-{date}.json"
    return f"{label}-{float(request_rate)}qps{conc}-{base}-{date}.json"


def _p_word(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)


def max_concurrent_requests(records: list[RequestRecord]) -> int:
    """The most successful requests active within one whole second of the run (vLLM's definition)."""
    ok = [r for r in records if r.ok]
    if not ok:
        return 0
    t0 = min(r.start for r in ok)
    counts: dict[int, int] = {}
    for r in ok:
        for sec in range(int(r.start - t0), int(r.end - t0) + 1):
            counts[sec] = counts.get(sec, 0) + 1
    return max(counts.values())


def summary_keys(metrics: dict, selected: list[str], percentiles: list[float]) -> dict:
    """mean/median/std/pNN `_{metric}_ms` for the selected metrics, from fd's summaries."""
    out: dict = {}
    for name in selected:
        stats = metrics[name]
        # vLLM writes 0 where a metric has no values (every request failed): np.mean(ttfts or 0).
        for stat in ("mean", "median", "std"):
            out[f"{stat}_{name}_ms"] = stats[f"{stat}_ms"] or 0.0
        for p in percentiles:
            out[f"p{_p_word(p)}_{name}_ms"] = stats[f"{percentile_label(p)}_ms"] or 0.0
    return out


def per_request_lists(records: list[RequestRecord]) -> dict:
    """vLLM's per-request lists in request order; a failed request has 0 lengths and 0.0 TTFT."""
    ordered = sorted(records, key=lambda r: r.index)
    mode = itl_mode(records)
    return {
        "input_lens": [r.prompt_len or 0 for r in ordered],
        "output_lens": [r.output_tokens if r.ok else 0 for r in ordered],
        "ttfts": [(r.ttft or 0.0) if r.ok else 0.0 for r in ordered],
        "itls": [request_itls(r, mode) if r.ok else [] for r in ordered],
        "generated_texts": [r.generated_text for r in ordered],
        "errors": [r.error for r in ordered],
    }


def vllm_result_keys(
    run: dict,
    metadata: dict[str, str],
    metrics: dict,
    records: list[RequestRecord],
    selected: list[str],
    percentiles: list[float],
    detailed: bool,
) -> dict:
    """The flat vLLM result object. `run` holds date, backend, label, model_id, tokenizer_id,
    num_prompts, request_rate, burstiness, max_concurrency (and the ramp-up keys when used)."""
    rate = run["request_rate"]
    out = {
        "date": run["date"],
        "endpoint_type": run["backend"],
        "backend": run["backend"],
        "label": run["label"],
        "model_id": run["model_id"],
        "tokenizer_id": run["tokenizer_id"],
        "num_prompts": run["num_prompts"],
        **metadata,
        "request_rate": "inf" if math.isinf(rate) else rate,
        "burstiness": run["burstiness"],
        "max_concurrency": run["max_concurrency"],
    }
    if run.get("ramp_up_strategy") is not None:
        for key in ("ramp_up_strategy", "ramp_up_start_rps", "ramp_up_end_rps"):
            out[key] = run[key]
    out.update(
        duration=metrics["duration_s"],
        completed=metrics["completed"],
        failed=metrics["failed"],
        total_input_tokens=metrics["total_input_tokens"],
        total_output_tokens=metrics["total_output_tokens"],
        request_throughput=metrics["request_throughput"],
        request_goodput=metrics["goodput"],
        output_throughput=metrics["output_throughput"],
        total_token_throughput=metrics["total_token_throughput"],
    )
    if detailed:
        out.update(per_request_lists(records))
    out["max_output_tokens_per_s"] = metrics["peak_output_throughput"]
    out["max_concurrent_requests"] = max_concurrent_requests(records)
    out.update(summary_keys(metrics, selected, percentiles))
    return out


# ---------------------------------------------------------------------------------------------------
# Reading vLLM's own result files back into fd's `metrics` layout, for `fd bench compare`.
_SERVE_KEYS = {
    "duration": "duration_s",
    "completed": "completed",
    "failed": "failed",
    "total_input_tokens": "total_input_tokens",
    "total_output_tokens": "total_output_tokens",
    "request_throughput": "request_throughput",
    "request_goodput": "goodput",
    "output_throughput": "output_throughput",
    "total_token_throughput": "total_token_throughput",
    "max_output_tokens_per_s": "peak_output_throughput",
}
_THROUGHPUT_KEYS = {
    "num_requests": "num_prompts",
    "elapsed_time": "mean_latency_s",
    "requests_per_second": "request_throughput",
    "tokens_per_second": "total_token_throughput",
}
_SUMMARY_KEY = re.compile(r"(mean|median|std|p[0-9.]+)_(ttft|tpot|itl|e2el)_ms")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _serve_metrics(flat: dict) -> dict:
    metrics: dict = {fd: flat[v] for v, fd in _SERVE_KEYS.items() if _number(flat.get(v))}
    for key, value in flat.items():
        match = _SUMMARY_KEY.fullmatch(key)
        if match and _number(value):
            stat, name = match.groups()
            label = percentile_label(float(stat[1:])) if stat.startswith("p") else stat
            metrics.setdefault(name, {})[f"{label}_ms"] = value
    return metrics


def _latency_metrics(flat: dict) -> dict:
    latency = {"mean_ms": flat["avg_latency"] * 1000.0}
    if _number(flat.get("std_latency")):
        latency["std_ms"] = flat["std_latency"] * 1000.0
    for p, seconds in (flat.get("percentiles") or {}).items():
        if _number(seconds):
            latency[f"{percentile_label(float(p))}_ms"] = seconds * 1000.0
    return {"latency": latency, "mean_latency_s": flat["avg_latency"]}


def metrics_from_vllm(flat: dict) -> tuple[str, dict] | None:
    """(kind, fd-style metrics) of a file written by `vllm bench serve|latency|throughput`, or None.

    Only what the flat keys hold: serve's counts, throughputs and ms summaries; latency's seconds as
    fd's `latency` ms summary; throughput's rates under fd's names."""
    if _number(flat.get("completed")) and _number(flat.get("request_throughput")):
        return "serve", _serve_metrics(flat)
    if _number(flat.get("avg_latency")):
        return "latency", _latency_metrics(flat)
    if _number(flat.get("requests_per_second")) and _number(flat.get("tokens_per_second")):
        metrics = {fd: flat[v] for v, fd in _THROUGHPUT_KEYS.items() if _number(flat.get(v))}
        return "throughput", metrics
    return None


def vllm_offline_keys(kind: str, times: list[float], metrics: dict, percentiles: list[float]) -> dict:
    """The keys `vllm bench latency|throughput --output-json` write, from fd's timed iterations.

    latency (vllm/benchmarks/latency.py): seconds; population std; `percentiles` maps each
    percentage to seconds (linear interpolation, numpy's default). throughput (throughput.py): one
    pass over all prompts, which is fd's mean timed iteration.
    """
    import numpy as np

    if kind == "latency":
        arr = np.asarray(times, dtype=np.float64)
        return {
            "avg_latency": float(arr.mean()),
            "std_latency": float(arr.std()),
            "latencies": [float(t) for t in times],
            "percentiles": {_p_word(p): float(np.percentile(arr, p)) for p in percentiles},
        }
    elapsed = metrics["mean_latency_s"]
    total = metrics["input_tokens_per_iter"] + metrics["output_tokens_per_iter"]
    return {
        "elapsed_time": elapsed,
        "num_requests": metrics["num_prompts"],
        "total_num_tokens": total,
        "requests_per_second": metrics["num_prompts"] / elapsed,
        "tokens_per_second": total / elapsed,
    }
