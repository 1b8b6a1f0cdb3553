"""The runner's one call after load (runner/huge_pages.py): it finds every tensor the kernels stream (the
packed linears, the LM head, the KV caches) and puts them on 2 MB pages where the kernel allows it;
the answers do not change."""

from __future__ import annotations

import re
from pathlib import Path

from fdcli_engine import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
PROMPTS = [[5, 17, 42, 99, 3], [7, 7, 8]]


def _thp_never() -> bool:
    try:
        return (
            re.search(r"\[(\w+)\]", Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text())[1]
            == "never"
        )
    except (OSError, TypeError):
        return True


def _engine(folder, monkeypatch, flag: str):
    monkeypatch.setenv("FD_HUGEPAGES", flag)
    # 2 layers x K and V x 2048 blocks x 8 tokens x kv heads x head_dim fp32: several MB of cache.
    return LLM(str(folder), max_model_len=128, block_size=8, num_kv_blocks=2048, kv_cache_dtype="float32")


def test_resident_tensors_cover_weights_and_caches(tiny_model_dir, monkeypatch):
    from fdcli_engine.runner.huge_pages import resident_tensors

    llm = _engine(tiny_model_dir(), monkeypatch, "0")
    runner = llm.engine.runner
    found = {id(t) for t in resident_tensors(runner.model, runner.kv_caches)}
    caches = [t for layer in runner.kv_caches for t in layer]
    assert caches and all(id(t) in found for t in caches)
    model = runner.model
    linears = [model.lm_head.lw] + [layer.mlp.down_proj.lw for layer in model.layers]
    for lw in linears:
        weight = lw.packed if hasattr(lw, "packed") else lw.weight
        assert id(weight) in found


def test_huge_pages_after_load_keep_the_answers(tiny_model_dir, monkeypatch):
    from fdcli_engine import ops

    folder = tiny_model_dir()
    small = _engine(folder, monkeypatch, "0")
    assert small.engine.runner.huge_page_bytes == 0
    huge = _engine(folder, monkeypatch, "1")
    if ops.backend == "native" and not _thp_never():
        assert huge.engine.runner.huge_page_bytes >= 2 << 20
    else:
        assert huge.engine.runner.huge_page_bytes == 0
    want = [o.outputs[0].token_ids for o in small.generate(PROMPTS, GREEDY)]
    assert [o.outputs[0].token_ids for o in huge.generate(PROMPTS, GREEDY)] == want
