"""Constrained requests draft too: their draft rows are masked as if the drafts were consumed (runner/
grammar_masks._fill_draft_rows) and the matcher gives the drafts back. Oracle: the same constrained
requests without speculation, token for token, and the reference checkers of tests/structured_output."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import jsonschema
import pytest
import tiny_models

from fdcli_engine import LLM, SamplingParams
from fdcli_engine.structured_output import StructuredOutputsParams as SO

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "structured_output"))
from test_engine_masks import SCHEMAS  # noqa: E402

# disable_by_batch_size: drafts at every batch size (the default budget stops them from 8 requests).
NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_min": 1,
    "prompt_lookup_max": 2,
    "disable_by_batch_size": 64,
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama-so")
    tiny_models.make_tiny_checkpoint("LlamaForCausalLM", path)
    tiny_models.write_tiny_tokenizer(path)
    return path


def _requests():
    constraints = [SO(json=s) for s in SCHEMAS.values()]
    constraints += [SO(regex=r"(ab|cd){2,6}-[0-9]{3}"), SO(choice=["alpha beta", "alpha gamma"])]
    params = []
    for i, so in enumerate(constraints):
        for temperature in (0.0, 1.0):
            params.append(
                SamplingParams(temperature=temperature, seed=i, max_tokens=120, structured_outputs=so)
            )
    return params


def test_constrained_outputs_identical(folder):
    params = _requests()
    prompts = ["the answer is"] * len(params)
    plain = LLM(str(folder), max_model_len=256, block_size=8).generate(prompts, params)
    llm = LLM(str(folder), max_model_len=256, block_size=8, speculative_config=NGRAM)
    spec = llm.generate(prompts, params)
    for sp, a, b in zip(params, plain, spec):
        assert b.outputs[0].token_ids == a.outputs[0].token_ids, sp.structured_outputs
        assert b.outputs[0].finish_reason == "stop"
        so = sp.structured_outputs
        if so.json is not None:
            schema = json.loads(so.json) if isinstance(so.json, str) else so.json
            jsonschema.validate(json.loads(b.outputs[0].text), schema)
        elif so.regex is not None:
            assert re.fullmatch(so.regex, b.outputs[0].text)
        else:
            assert b.outputs[0].text in so.choice
    stats = llm.get_stats()
    assert 0 < stats["spec_decode_num_accepted_tokens_total"] < stats["spec_decode_num_draft_tokens_total"]
