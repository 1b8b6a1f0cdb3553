"""Benchmark metrics as pure functions of timestamped request records.

Nothing here reads a clock: every time is data on a `RequestRecord`, so tests can feed exact
timestamps and compare with hand-computed values.

Definitions (times in seconds on one monotonic clock; reported in ms):
- TTFT: first chunk carrying output text minus send time.
- E2EL: end of the stream minus send time.
- TPOT: per request, (E2EL - TTFT) / (output_tokens - 1); requests with one output token have none.
- ITL, "token" mode: a chunk carrying k tokens contributes its gap since the previous chunk plus k-1
  gaps of zero (the first chunk contributes k-1 zeros), so a request yields exactly output_tokens-1
  gaps. Used only when every successful request's per-chunk token counts are known exactly.
- ITL, "chunk" mode: gaps between consecutive chunks. The label in every output says which mode.
- Throughputs divide by the benchmark duration; only successful requests count.
- Peak output throughput: output tokens bucketed by the whole second (since the benchmark start) in
  which their chunk arrived; the largest bucket.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from fdcli_engine.errors import ConfigError

GOODPUT_METRICS = ("ttft", "tpot", "e2el")
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
MAX_ERRORS_SHOWN = 5


@dataclass
class RequestRecord:
    index: int
    ok: bool = False
    error: str = ""
    prompt_len: int | None = None  # tokens: the server's usage count when present, else the dataset's
    output_tokens: int = 0
    output_tokens_source: str = ""  # "usage" | "tokenizer" | "chunks"
    start: float = 0.0  # when the request was sent
    end: float = 0.0  # when its stream finished (or failed)
    chunk_times: list[float] = field(default_factory=list)  # arrival of each chunk carrying output
    chunk_tokens: list[int] | None = None  # tokens per chunk when known exactly (sums to output_tokens)
    generated_text: str = ""

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] - self.start if self.chunk_times else None

    @property
    def e2el(self) -> float:
        return self.end - self.start

    @property
    def tpot(self) -> float | None:
        ttft = self.ttft
        if ttft is None or self.output_tokens < 2:
            return None
        return (self.e2el - ttft) / (self.output_tokens - 1)


def parse_goodput(spec: list[str] | str | None) -> dict[str, float]:
    """Parse `ttft:200 tpot:50 e2el:2000` (ms; spaces or commas) into {metric: seconds}."""
    if not spec:
        return {}
    parts = spec if isinstance(spec, list) else [spec]
    items = [p for part in parts for p in re.split(r"[,\s]+", part.strip()) if p]
    slo: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition(":")
        name = name.strip().lower()
        if not sep or name not in GOODPUT_METRICS:
            raise ConfigError(f"--goodput {item!r}: expected METRIC:MS with METRIC one of ttft, tpot, e2el")
        try:
            ms = float(value)
        except ValueError:
            raise ConfigError(f"--goodput {item!r}: {value!r} is not a number of milliseconds") from None
        if not math.isfinite(ms) or ms <= 0:
            raise ConfigError(f"--goodput {item!r}: the limit must be a positive number of milliseconds")
        slo[name] = ms / 1000.0
    return slo


def parse_percentiles(spec: str) -> list[float]:
    try:
        values = [float(p) for p in spec.split(",") if p.strip()]
    except ValueError:
        raise ConfigError(f"--percentiles {spec!r}: expected comma-separated numbers like 50,90,99") from None
    if not values or any(not 0 <= v <= 100 for v in values):
        raise ConfigError(f"--percentiles {spec!r}: each value must be between 0 and 100")
    return values


def itl_mode(records: list[RequestRecord]) -> str:
    ok = [r for r in records if r.ok and r.chunk_times]
    exact = all(r.chunk_tokens is not None and sum(r.chunk_tokens) == r.output_tokens for r in ok)
    return "token" if exact else "chunk"


def request_itls(record: RequestRecord, mode: str) -> list[float]:
    times = record.chunk_times
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    if mode == "chunk":
        return gaps
    counts = record.chunk_tokens or [1] * len(times)
    out = [0.0] * max(counts[0] - 1, 0) if counts else []
    for gap, k in zip(gaps, counts[1:], strict=False):
        out.append(gap)
        out.extend([0.0] * max(k - 1, 0))
    return out


def percentile_label(p: float) -> str:
    return f"p{p:g}".replace(".", "_")


def summarize(values: list[float], percentiles: list[float]) -> dict[str, float | None]:
    """mean/median/std/percentiles in ms (population std, linear-interpolated percentiles)."""
    import numpy as np

    keys = ["mean_ms", "median_ms", "std_ms"] + [f"{percentile_label(p)}_ms" for p in percentiles]
    if not values:
        return dict.fromkeys(keys, None)
    arr = np.asarray(values, dtype=np.float64) * 1000.0
    stats = [arr.mean(), np.median(arr), arr.std()] + [np.percentile(arr, p) for p in percentiles]
    return {k: float(v) for k, v in zip(keys, stats, strict=True)}


def token_arrivals(record: RequestRecord, mode: str) -> list[tuple[float, float]]:
    """(time, tokens) pairs for one request: exact per chunk, or spread evenly over its chunks."""
    if not record.chunk_times:
        return [(record.end, float(record.output_tokens))] if record.output_tokens else []
    if mode == "token" and record.chunk_tokens is not None:
        return [(t, float(k)) for t, k in zip(record.chunk_times, record.chunk_tokens, strict=True)]
    share = record.output_tokens / len(record.chunk_times)
    return [(t, share) for t in record.chunk_times]


def throughput_series(records: list[RequestRecord], bench_start: float, mode: str) -> list[float]:
    """Output tokens per whole second since `bench_start` (index i covers [i, i+1) seconds)."""
    buckets: dict[int, float] = {}
    for r in records:
        if not r.ok:
            continue
        for t, k in token_arrivals(r, mode):
            sec = max(int(math.floor(t - bench_start)), 0)
            buckets[sec] = buckets.get(sec, 0.0) + k
    if not buckets:
        return []
    return [buckets.get(i, 0.0) for i in range(max(buckets) + 1)]


def is_good(record: RequestRecord, slo: dict[str, float]) -> bool:
    values = {"ttft": record.ttft, "tpot": record.tpot, "e2el": record.e2el}
    # A one-token request has no TPOT; it cannot violate a TPOT limit.
    return record.ok and all(values[m] is None or values[m] <= limit for m, limit in slo.items())


def compute_metrics(
    records: list[RequestRecord],
    duration: float,
    bench_start: float,
    percentiles: list[float],
    goodput_slo: dict[str, float] | None = None,
) -> dict:
    """All summary metrics of a run, with stable keys for a given percentile list."""
    ok = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    mode = itl_mode(records)
    duration = max(duration, 1e-9)
    total_in = sum(r.prompt_len or 0 for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    series = throughput_series(records, bench_start, mode)
    per_metric = {
        "ttft": [r.ttft for r in ok if r.ttft is not None],
        "tpot": [r.tpot for r in ok if r.tpot is not None],
        "itl": [g for r in ok for g in request_itls(r, mode)],
        "e2el": [r.e2el for r in ok],
    }
    metrics: dict = {
        "num_requests": len(records),
        "completed": len(ok),
        "failed": len(failed),
        "duration_s": duration,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration,
        "output_throughput": total_out / duration,
        "total_token_throughput": (total_in + total_out) / duration,
        "peak_output_throughput": max(series) if series else 0.0,
        "itl_mode": mode,
        "output_tokens_source": sorted({r.output_tokens_source for r in ok if r.output_tokens_source}),
        "good_requests": None,
        "goodput": None,
        "goodput_slo_ms": {k: v * 1000.0 for k, v in (goodput_slo or {}).items()},
    }
    if goodput_slo:
        good = sum(is_good(r, goodput_slo) for r in ok)
        metrics["good_requests"] = good
        metrics["goodput"] = good / duration
    for name in LATENCY_METRICS:
        metrics[name] = summarize(per_metric[name], percentiles)
    metrics["errors"] = [{"index": r.index, "error": r.error} for r in failed[:MAX_ERRORS_SHOWN]]
    metrics["throughput_series"] = series
    return metrics
