"""SmolLM2 (the default model, GGUF blocks) as its own draft model: the greedy tokens of two chat
prompts equal plain decoding's, and every draft is accepted: the draft's cache, built by the draft's
own forwards in the target's block pool, holds what the target's does."""

from __future__ import annotations

import pytest

from fdcli_engine import LLM, SamplingParams
from fdcli_engine.config import default_model_path

MESSAGES = [
    [{"role": "user", "content": "Name three colours."}],
    [{"role": "user", "content": "Count from one to ten in words."}],
]


@pytest.mark.slow
def test_smollm2_as_its_own_draft():
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    spec = {"method": "draft_model", "model": str(default_model_path()), "num_speculative_tokens": 3}
    plain = [o.outputs[0].token_ids for o in LLM(max_model_len=256).chat(MESSAGES, params)]
    llm = LLM(max_model_len=256, speculative_config=spec)
    outs = [o.outputs[0].token_ids for o in llm.chat(MESSAGES, params)]
    assert outs == plain
    stats = llm.get_stats()
    assert stats["spec_decode_num_draft_tokens_total"] >= 20
    assert stats["spec_decode_num_accepted_tokens_total"] == stats["spec_decode_num_draft_tokens_total"]
