"""--kv-offload-dir across a restart of `fd serve` (docs/kv-offload.md): the first server writes the
blocks of a finished request on its way down; a second server with the same model and directory loads
them for the same prompt (other process, so the persisted prefix-hash key is what names them) and
answers the same."""

from __future__ import annotations

import os
import stat

from fd_server import start_server

PROMPT = "the quick brown fox jumps over the lazy dog " * 6
LABELS = '{engine="0",model_name="tiny"}'


def ask(srv):
    out = srv.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=8, temperature=0)
    return out.choices[0].text, srv.metrics()


def test_file_tier_survives_a_restart_of_fd_serve(tiny_model, tmp_path):
    kv_dir = tmp_path / "kv"
    args = ("--served-model-name", "tiny", "--block-size", "4", "--kv-offload-dir", str(kv_dir))
    first = start_server(tiny_model, tmp_path, *args)
    try:
        text, m = ask(first)
    finally:
        assert first.stop() == 0, first.log.read_text()[-3000:]
    assert m["fd:kv_offload_hit_tokens_total"] == 0
    # vLLM's external prefix cache: the connector was asked for the whole prompt (no local hit), and had none.
    assert m[f"vllm:external_prefix_cache_queries_total{LABELS}"] == m["fd:prompt_tokens_total"] > 0
    assert m[f"vllm:external_prefix_cache_hits_total{LABELS}"] == 0
    assert list(kv_dir.rglob("*.kv")), "the finished request's blocks were not written"
    assert stat.S_IMODE(os.stat(kv_dir / "prefix-hash.key").st_mode) == 0o600

    second = start_server(tiny_model, tmp_path, *args)
    try:
        text2, m2 = ask(second)
    finally:
        assert second.stop() == 0, second.log.read_text()[-3000:]
    assert text2 == text
    assert m2["fd:kv_offload_hit_tokens_total"] > 0
    assert m2['fd:kv_offload_total_bytes_total{transfer_type="DISK_to_KV"}'] > 0
    assert m2["fd:cpu_hit_token_rate"] > 0
    # What the file tier supplied is vLLM's external hit, its external_kv_transfer source and cached tokens.
    loaded = m2["fd:kv_offload_hit_tokens_total"]
    assert m2[f"vllm:external_prefix_cache_hits_total{LABELS}"] == loaded
    assert m2[f"vllm:external_prefix_cache_queries_total{LABELS}"] == m2["fd:prompt_tokens_total"]
    assert (
        m2['vllm:prompt_tokens_by_source_total{engine="0",model_name="tiny",source="external_kv_transfer"}']
        == loaded
    )
    assert m2[f"vllm:prompt_tokens_cached_total{LABELS}"] == loaded
