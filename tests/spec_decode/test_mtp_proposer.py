"""The mtp proposer over a tiny ERNIE-4.5 with a random MTP head (Paddle layout), driven by
proposer_loop.SpecLoop: the tokens are the target's own greedy ones (the random head's drafts are
almost never accepted), with chunked prompts, prefix-cache hits and preemption. With every draft
taken as accepted, the drafts of every step equal the transformers composition of the head computed
from scratch over the whole sequence (test_mtp_head.reference_mtp): the head's KV cache holds, step
after step, what it would hold had the sequence been run at once."""

from __future__ import annotations

import pytest
import torch
from proposer_loop import PROMPTS, SCENARIOS, plain_greedy, run_scenario
from test_mtp_head import mtp_config, reference_mtp
from tiny_models import load_hf_model, make_tiny_ernie_mtp, tiny_mtp_tensors

from fdcli_engine.loader import load_model
from fdcli_engine.runner.mtp_proposer import MTPProposer

K = 2


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("ernie-mtp")
    return {
        "paddle": make_tiny_ernie_mtp(root / "paddle"),
        "hf": make_tiny_ernie_mtp(root / "hf", layout="hf"),
    }


@pytest.fixture(scope="module")
def target(folders):
    return load_model(mtp_config(folders["paddle"], k=K))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_random_mtp_head_changes_no_token(folders, target, scenario):
    loop = run_scenario(target, MTPProposer(mtp_config(folders["paddle"], k=K), target), K, scenario)
    for rid, seq in loop.seqs.items():
        assert seq.output == plain_greedy(target, seq.prompt, len(seq.output)), rid
    assert loop.num_draft_tokens > 10
    assert loop.num_accepted <= loop.num_draft_tokens // 10  # random head: acceptance near zero


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_drafts_equal_the_head_run_from_scratch(folders, target, scenario):
    hf = load_hf_model(folders["hf"])
    head = tiny_mtp_tensors(hf.config.to_dict())
    checked = []

    def check(loop):
        for rid, seq in loop.seqs.items():
            if seq.drafts and not seq.done:  # a finished one's last tokens were cut at max_tokens
                _, ref = reference_mtp(hf, head, seq.tokens, extra=len(seq.drafts) - 1)
                assert seq.drafts == ref, (rid, len(seq.tokens))
                checked.append(rid)

    with torch.no_grad():
        loop = run_scenario(
            target,
            MTPProposer(mtp_config(folders["paddle"], k=K), target),
            K,
            scenario,
            check,
            accept_all=True,
        )
    assert loop.num_accepted == loop.num_draft_tokens > 10
    assert len(checked) >= 6
    assert set(checked) == set(loop.seqs) and set(loop.seqs) <= set(PROMPTS)


def test_moe_target_drafts_with_its_dense_mtp_layer(tmp_path):
    moe = dict(
        num_hidden_layers=2,
        moe_num_experts=4,
        moe_k=2,
        moe_intermediate_size=32,
        moe_num_shared_experts=1,
        moe_layer_start_index=1,
        tie_word_embeddings=True,
    )
    folder = make_tiny_ernie_mtp(tmp_path / "moe", arch="Ernie4_5_MoeForCausalLM", **moe)
    cfg = mtp_config(folder, k=K)
    target = load_model(cfg)
    assert type(target).__name__ == "Ernie4_5_MoeForCausalLM"
    loop = run_scenario(target, MTPProposer(cfg, target), K, "chunked")
    for rid, seq in loop.seqs.items():
        assert seq.output == plain_greedy(target, seq.prompt, len(seq.output)), rid
    assert loop.num_draft_tokens > 10
