"""The default model with prompt lookup: a passage-rewriting chat turn, greedy, token-identical to plain
decoding, with most drafts accepted (the workload speculation is for)."""

from __future__ import annotations

import pytest

from fdcli_engine import LLM, SamplingParams

PASSAGE = (
    "The lighthouse keeper climbed the narrow stairs every evening at dusk. He lit the great lamp, wound "
    "the clockwork that turned the lens, and wrote the weather in his log before the ships came by."
)
CHAT = [{"role": "user", "content": f"Copy this passage word for word:\n\n{PASSAGE}"}]


@pytest.mark.slow
def test_smollm2_ngram_greedy_identical():
    params = SamplingParams(temperature=0, max_tokens=40, logprobs=0)
    plain = LLM(max_model_len=512).chat(CHAT, params)[0].outputs[0]
    llm = LLM(max_model_len=512, speculative_config={"method": "ngram_match", "num_speculative_tokens": 4})
    spec = llm.chat(CHAT, params)[0].outputs[0]
    assert spec.token_ids == plain.token_ids
    assert [lp[t].logprob for t, lp in zip(spec.token_ids, spec.logprobs)] == [
        lp[t].logprob for t, lp in zip(plain.token_ids, plain.logprobs)
    ]
    stats = llm.get_stats()
    assert stats["spec_decode_num_accepted_tokens_total"] > 0.5 * stats["spec_decode_num_draft_tokens_total"]
