"""fd's ERNIE-4.5 MTP head and proposer against a transformers composition of FastDeploy's structure
(Ernie4_5_MTPModel): e = enorm(embed(x_{j+1})), g = hnorm(h_j) with h_j the target's final-norm output,
u = eh_proj([e, g]), then one ERNIE decoder layer and the target's final norm (transformers'
Ernie4_5Model with that one layer), then the target's lm_head. Drafts after the first feed the head's
own output back as g. Tiny random checkpoint; the MTP head is loaded from the Paddle layout (the HF
layout and a separate MTP folder must load the same tensors). Tolerance: logits within atol 1e-4 (fp32
summation order), drafts identical.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from ops_backend import switched_ops
from proposer_loop import SpecLoop, paddle_ids
from tiny_models import (
    load_hf_model,
    make_attention_metadata,
    make_tiny_checkpoint,
    make_tiny_ernie_mtp,
    tiny_mtp_tensors,
)

from fdcli_engine.config import EngineConfig
from fdcli_engine.config_resolver import resolve_config
from fdcli_engine.errors import ConfigError
from fdcli_engine.loader import iter_mtp_weights, load_model
from fdcli_engine.runner.mtp_proposer import MTPProposer

PROMPT = [5, 17, 42, 99, 3, 250, 7, 128, 64, 311]
ATOL = 1e-4


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("ernie-mtp")
    return {
        "paddle": make_tiny_ernie_mtp(root / "paddle", layout="paddle"),
        "hf": make_tiny_ernie_mtp(root / "hf", layout="hf"),
        "folder": make_tiny_ernie_mtp(root / "sep", layout="paddle", mtp="folder"),
        "none": make_tiny_ernie_mtp(root / "none", layout="paddle", mtp="none"),
    }


def mtp_config(folder, k=2, **spec):
    return resolve_config(
        EngineConfig(
            model=str(folder), speculative_config={"method": "mtp", "num_speculative_tokens": k, **spec}
        )
    )


def reference_mtp(hf, head: dict, tokens: list[int], extra: list[int]) -> tuple[np.ndarray, list[int]]:
    """Logits of the head's rows over `tokens` (positions 0..n-2 take tokens[1:] and the target's
    hidden states h_0..h_{n-2}), then greedy drafts continuing with the head's own output for `extra`
    more rows; returns (logits of the first rows, the 1 + extra drafts)."""
    from transformers.models.ernie4_5.modeling_ernie4_5 import Ernie4_5Model, Ernie4_5RMSNorm

    cfg = hf.config
    one = copy.deepcopy(cfg)
    one.num_hidden_layers = 1
    block = Ernie4_5Model(one).eval()
    state = {k[len("model.mtp_block.0.") :]: torch.from_numpy(v) for k, v in head.items() if "mtp_block" in k}
    block.layers[0].load_state_dict(state)
    block.norm.weight.data = hf.model.norm.weight.data.clone()
    norms = []
    for key in ("model.mtp_emb_norm.0.weight", "model.mtp_hidden_norm.0.weight"):
        n = Ernie4_5RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        n.weight.data = torch.from_numpy(head[key])
        norms.append(n)
    proj = torch.from_numpy(head["model.mtp_linear_proj.0.weight"])

    def rows(next_ids, hidden):
        e = norms[0](hf.model.embed_tokens(torch.tensor(next_ids)))
        return torch.cat([e, norms[1](hidden)], dim=-1) @ proj.T

    with torch.no_grad():
        h = hf.model(torch.tensor([tokens])).last_hidden_state[0]
        u = rows(tokens[1:], h[:-1])
        out = block(inputs_embeds=u[None]).last_hidden_state[0]
        logits = hf.lm_head(out)
        drafts = [int(logits[-1].argmax())]
        for _ in range(extra):
            u = torch.cat([u, rows([drafts[-1]], out[-1:])])
            out = block(inputs_embeds=u[None]).last_hidden_state[0]
            drafts.append(int(hf.lm_head(out[-1]).argmax()))
    return logits.numpy(), drafts


@pytest.fixture(params=["reference", "auto"])
def backend(request):
    yield from switched_ops(request.param)


def test_mtp_head_matches_fastdeploy_structure(folders, backend):
    cfg = mtp_config(folders["paddle"], k=3)
    target = load_model(cfg)
    proposer = MTPProposer(cfg, target)
    if backend == "native":
        assert proposer.model.decoder_stack is not None  # the one-op stack, as the target's
    hf = load_hf_model(folders["hf"])
    head = tiny_mtp_tensors(hf.config.to_dict())
    with torch.no_grad():
        first = int(hf(torch.tensor([PROMPT])).logits[0, -1].argmax())
    ref_logits, ref_drafts = reference_mtp(hf, head, PROMPT + [first], extra=2)

    loop = SpecLoop(target, proposer, k=3)
    loop.add("r", PROMPT, max_tokens=8)
    loop.step()  # the whole prompt: the target samples `first`, the head drafts 3 tokens
    assert loop.seqs["r"].output == [first]
    assert loop.seqs["r"].drafts == ref_drafts

    # The head's logits of every prompt row, through the same KV cache slots.
    rs = loop.seqs["r"]
    meta, positions = make_attention_metadata([(0, len(PROMPT), rs.block_ids)], loop.block_size)
    ids = paddle_ids(PROMPT[1:] + [first])
    hidden = target.forward(paddle_ids(PROMPT), positions, loop.kv, meta)
    out = proposer.model.forward(ids, hidden, positions, proposer.kv_caches, meta)
    np.testing.assert_allclose(proposer.model.compute_logits(out).numpy(), ref_logits, atol=ATOL)


def first_drafts(cfg) -> list[int]:
    """The head's drafts after the prompt's step."""
    target = load_model(cfg)
    loop = SpecLoop(target, MTPProposer(cfg, target), k=cfg.speculative_config.num_speculative_tokens)
    loop.add("r", PROMPT, max_tokens=4)
    loop.step()
    return loop.seqs["r"].drafts


def test_hf_naming_and_separate_folder_load_the_same_head(folders):
    def names_and_sums(source):
        return {n: float(np.abs(a).sum()) for n, a in iter_mtp_weights(source)}

    from_paddle = names_and_sums(folders["paddle"])
    assert from_paddle.keys() == tiny_mtp_tensors(load_hf_model(folders["hf"]).config.to_dict()).keys()
    for other in (folders["hf"], folders["folder"] / "mtp"):
        got = names_and_sums(other)
        assert got.keys() == from_paddle.keys()
        np.testing.assert_allclose([got[n] for n in from_paddle], list(from_paddle.values()), rtol=1e-6)
    # Paddle inline, HF inline and a separate MTP folder ("model") draft the same tokens.
    expected = first_drafts(mtp_config(folders["paddle"]))
    assert len(expected) == 2
    assert first_drafts(mtp_config(folders["hf"])) == expected
    assert first_drafts(mtp_config(folders["folder"], model=str(folders["folder"] / "mtp"))) == expected


def test_mtp_without_mtp_weights_is_refused(folders):
    cfg = mtp_config(folders["none"])
    with pytest.raises(ConfigError, match=r"^--speculative-config: method mtp: .*no MTP weights") as e:
        MTPProposer(cfg, load_model(cfg))
    assert "\n" not in str(e.value)


def test_mtp_on_a_non_ernie_model_is_refused(tmp_path):
    folder = make_tiny_checkpoint("LlamaForCausalLM", tmp_path / "llama")
    cfg = mtp_config(folder)
    with pytest.raises(ConfigError, match=r"method mtp .* LlamaForCausalLM does not have: use ngram"):
        MTPProposer(cfg, load_model(cfg))
