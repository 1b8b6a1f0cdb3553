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
    text = ServerMetrics("tiny", 2048).render(stats).decode()
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


def test_a_real_engines_stats_render_consistently(tiny_model):
    """The tiny Llama with ngram drafts (random tiny models loop, so drafts are found, some right): the
    scrape shows the engine's own counts, per-position counts sum to the accepted total, and every
    verification emitted its accepted drafts plus one token (ignore_eos: no stop cuts a step short)."""
    import random

    from fdcli_engine import LLM, SamplingParams

    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    llm = LLM(str(tiny_model), speculative_config=spec, max_model_len=128, num_kv_blocks=64, block_size=8)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 200) for _ in range(12)] for _ in range(3)]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))
    stats = llm.get_stats()
    m = _samples(stats)
    drafted = m[("fd:spec_decode_num_draft_tokens_total", ())]
    accepted = m[("fd:spec_decode_num_accepted_tokens_total", ())]
    drafts = m[("fd:spec_decode_num_drafts_total", ())]
    assert drafted == stats["spec_decode_num_draft_tokens_total"] and 0 < accepted < drafted, stats
    per_pos = [
        m[("fd:spec_decode_num_accepted_tokens_per_pos_total", (("position", str(i)),))] for i in range(3)
    ]
    assert sum(per_pos) == accepted and per_pos == sorted(per_pos, reverse=True)
    assert m[("fd:spec_decode_num_emitted_tokens_total", ())] == accepted + drafts
    assert m[("fd:spec_decode_draft_acceptance_rate", ())] == pytest.approx(accepted / drafted)
