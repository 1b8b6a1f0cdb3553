"""Rich rendering of benchmark results: the summary table, unicode bar charts, the comparison table."""

from __future__ import annotations

from rich.table import Table

from fdcli.bench.metrics import LATENCY_METRICS

BAR = "█"
PARTIAL = " ▏▎▍▌▋▊▉"
CHART_WIDTH = 40
MAX_ROWS = 24


def _fmt(v, digits: int = 2) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def bar(value: float, peak: float, width: int = CHART_WIDTH) -> str:
    """A horizontal bar in eighths of a character, `width` characters at `peak`."""
    if peak <= 0 or value <= 0:
        return ""
    eighths = round(value / peak * width * 8)
    return BAR * (eighths // 8) + (PARTIAL[eighths % 8] if eighths % 8 else "")


LABELS = {
    "ttft": "Time to first token",
    "tpot": "Time per output token (excl. 1st)",
    "e2el": "End-to-end latency",
}


def summary_table(
    metrics: dict, title: str = "fd bench serve", selected: tuple[str, ...] | list[str] = LATENCY_METRICS
) -> Table:
    t = Table(title=title, show_header=False, title_justify="left")
    t.add_column("metric")
    t.add_column("value", justify="right")
    rows = [
        ("Successful requests", metrics["completed"]),
        ("Failed requests", metrics["failed"]),
        ("Benchmark duration (s)", metrics["duration_s"]),
        ("Total input tokens", metrics["total_input_tokens"]),
        ("Total output tokens", metrics["total_output_tokens"]),
        ("Request throughput (req/s)", metrics["request_throughput"]),
        ("Output token throughput (tok/s)", metrics["output_throughput"]),
        ("Peak output throughput (tok/s, 1 s buckets)", metrics["peak_output_throughput"]),
        ("Total token throughput (tok/s)", metrics["total_token_throughput"]),
    ]
    if metrics.get("goodput") is not None:
        slo = " ".join(f"{k}≤{v:g}ms" for k, v in metrics["goodput_slo_ms"].items())
        rows.append((f"Goodput (req/s, {slo})", metrics["goodput"]))
    for label, value in rows:
        t.add_row(label, _fmt(value))
    itl_label = (
        "Inter-token latency (per token)"
        if metrics["itl_mode"] == "token"
        else "Inter-chunk latency (per chunk)"
    )
    for name in (m for m in LATENCY_METRICS if m in selected):
        stats = metrics[name]
        t.add_row(f"[bold]{itl_label if name == 'itl' else LABELS[name]}[/]", "")
        for key, value in stats.items():
            t.add_row(f"  {key.removesuffix('_ms').replace('_', '.')} (ms)", _fmt(value))
    sources = ", ".join(metrics.get("output_tokens_source") or []) or "–"
    t.add_row("Output tokens counted by", sources)
    return t


def throughput_chart(series: list[float]) -> list[str]:
    """Output tokens/s over time; long runs are grouped into equal bins (mean tok/s per bin)."""
    if not series:
        return []
    group = -(-len(series) // MAX_ROWS)
    bins = [series[i : i + group] for i in range(0, len(series), group)]
    rates = [sum(b) / len(b) for b in bins]
    peak = max(rates)
    lines = [f"Output throughput over time (tok/s, {group} s per row)"]
    for i, rate in enumerate(rates):
        lines.append(f"{i * group:>5d}s │{bar(rate, peak):<{CHART_WIDTH}} {rate:,.1f}")
    return lines


def ttft_histogram(ttfts_ms: list[float], bins: int = 10) -> list[str]:
    if not ttfts_ms:
        return []
    lo, hi = min(ttfts_ms), max(ttfts_ms)
    width = (hi - lo) / bins or 1.0
    counts = [0] * bins
    for v in ttfts_ms:
        counts[min(int((v - lo) / width), bins - 1)] += 1
    peak = max(counts)
    lines = ["TTFT distribution (ms)"]
    for i, c in enumerate(counts):
        left = lo + i * width
        lines.append(f"{left:>9.1f}–{left + width:<9.1f}│{bar(c, peak):<{CHART_WIDTH}} {c}")
    return lines


def compare_table(names: list[str], rows) -> Table:
    t = Table(title="fd bench compare (ratio vs the first run)", title_justify="left")
    t.add_column("metric")
    for n in names:
        t.add_column(n, justify="right")
    for metric, values, ratios in rows:
        cells = []
        for i, (v, r) in enumerate(zip(values, ratios, strict=True)):
            text = _fmt(v)
            if i > 0 and r is not None:
                text += f" ({r:.2f}×)"
            cells.append(text)
        t.add_row(metric, *cells)
    return t


def print_report(metrics: dict, records, chart: bool = True, selected=LATENCY_METRICS) -> None:
    """Summary table, charts and the first errors, on stdout."""
    from rich.markup import escape

    from fdcli.console import console

    if metrics.get("interrupted"):
        console.print("[bold yellow]Interrupted: partial results over the requests that finished.[/]")
    console.print(summary_table(metrics, selected=selected))
    if chart:
        lines = throughput_chart(metrics["throughput_series"])
        ttfts = [r.ttft * 1000.0 for r in records if r.ok and r.ttft is not None]
        lines += [""] + ttft_histogram(ttfts) if ttfts else []
        for line in lines:
            console.print(escape(line), highlight=False)
    if metrics["failed"]:
        console.print(f"[bold red]{metrics['failed']} request(s) failed[/]; first errors:")
        for err in metrics["errors"]:
            console.print(f"  #{err['index']}: {escape(err['error'])}", highlight=False)
