"""/metrics for speculative decoding: FastDeploy's counter names under fd's prefix, the acceptance rate and
vLLM's per-position counter, fed from the core's get_stats() keys; absent when speculation is off.

The stats are a stub dict (the keys EngineCore.get_stats reports); the exposition is parsed with
prometheus_client's own parser, so a malformed family or label fails here."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fdcli_engine.entrypoints.openai.metrics import ServerMetrics

# 10 verification steps of k=3 drafts, 30 draft tokens: 9 steps accepted the first draft, 6 the
# second, 3 the third (18 accepted); emitted = accepted + one target token per step = 28.
SPEC = {
    "spec_decode_num_drafts": 10,
    "spec_decode_num_draft_tokens_total": 30,
    "spec_decode_num_accepted_tokens_total": 18,
    "spec_decode_num_emitted_tokens_total": 28,
    "spec_decode_num_accepted_tokens_per_pos": [9, 6, 3],
}
BASE = {"num_running": 1, "num_waiting": 0, "kv_cache_usage": 0.25, "generation_tokens_total": 40}


def _samples(stats: dict | None) -> dict[tuple[str, tuple], float]:
    text = ServerMetrics().render(stats).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_spec_decode_counters_use_fastdeploy_names():
    m = _samples({**BASE, **SPEC})
    assert m[("fd:spec_decode_num_draft_tokens_total", ())] == 30
    assert m[("fd:spec_decode_num_accepted_tokens_total", ())] == 18
    assert m[("fd:spec_decode_num_emitted_tokens_total", ())] == 28
    assert m[("fd:spec_decode_num_drafts_total", ())] == 10
    assert m[("fd:spec_decode_draft_acceptance_rate", ())] == pytest.approx(18 / 30)
    assert m[("fd:generation_tokens_total", ())] == 40  # the other metrics are untouched


def test_accepted_tokens_per_position_is_one_labelled_counter():
    m = _samples({**BASE, **SPEC})
    per_pos = {k[1]: v for k, v in m.items() if k[0] == "fd:spec_decode_num_accepted_tokens_per_pos_total"}
    assert per_pos == {(("position", "0"),): 9, (("position", "1"),): 6, (("position", "2"),): 3}
    rates = {k[1]: v for k, v in m.items() if k[0] == "fd:spec_decode_draft_acceptance_rate_per_pos"}
    assert rates == {(("position", "0"),): 0.9, (("position", "1"),): 0.6, (("position", "2"),): 0.3}


def test_no_spec_decode_metrics_without_speculation():
    for stats in (BASE, {}, None):
        names = {name for name, _ in _samples(stats)}
        assert "fd:generation_tokens_total" in names
        assert not any("spec_decode" in n for n in names), names


def test_before_any_draft_the_rates_are_zero_not_nan():
    zero = {
        "spec_decode_num_drafts": 0,
        "spec_decode_num_draft_tokens_total": 0,
        "spec_decode_num_accepted_tokens_total": 0,
        "spec_decode_num_emitted_tokens_total": 0,
        "spec_decode_num_accepted_tokens_per_pos": [0, 0],
    }
    m = _samples({**BASE, **zero})
    assert m[("fd:spec_decode_draft_acceptance_rate", ())] == 0.0
    assert m[("fd:spec_decode_draft_acceptance_rate_per_pos", (("position", "1"),))] == 0.0
    assert m[("fd:spec_decode_num_accepted_tokens_per_pos_total", (("position", "0"),))] == 0.0


def test_the_server_route_exports_the_engine_stats(tokenizer):
    """The /metrics route of the app reads the engine's get_stats(): the spec keys reach the scrape."""
    from scripted import scripted_client

    _, http, engine = scripted_client(tokenizer, ["a"])

    async def stats():
        return {**BASE, **SPEC}

    engine.get_stats = stats
    r = http.get("/metrics")
    assert r.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    (sample,) = families["fd:spec_decode_num_accepted_tokens"].samples
    assert (sample.name, sample.value) == ("fd:spec_decode_num_accepted_tokens_total", 18)
