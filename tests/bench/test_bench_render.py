"""Rendering: bar lengths, chart binning, and a summary table that tolerates missing values."""

from rich.console import Console

from fdcli.bench.metrics import RequestRecord, compute_metrics
from fdcli.bench.render import CHART_WIDTH, bar, summary_table, throughput_chart, ttft_histogram


def test_bar_lengths_are_proportional_in_eighths():
    assert bar(10, 10) == "█" * CHART_WIDTH
    assert bar(5, 10, width=8) == "████"
    assert bar(1, 16, width=2) == "▏"  # one eighth of a character
    assert bar(0, 10) == "" and bar(3, 0) == ""


def test_throughput_chart_groups_long_runs_into_bins():
    lines = throughput_chart([10.0] * 30 + [40.0] * 30)  # 60 s → 3 s per row, 20 rows
    assert lines[0].endswith("(tok/s, 3 s per row)") and len(lines) == 21
    assert lines[1].endswith(" 10.0") and lines[-1].endswith(" 40.0")
    assert throughput_chart([]) == []


def test_ttft_histogram_counts_every_value_once():
    lines = ttft_histogram([10.0, 11.0, 19.0, 20.0], bins=2)
    assert [int(line.split()[-1]) for line in lines[1:]] == [2, 2]


def test_summary_table_renders_with_no_successful_requests():
    m = compute_metrics([RequestRecord(index=0, error="x")], 1.0, 0.0, [50])
    console = Console(width=120, record=True)
    console.print(summary_table(m))
    text = console.export_text()
    assert "Failed requests" in text and "Inter-chunk latency (per chunk)" not in text and "–" in text
