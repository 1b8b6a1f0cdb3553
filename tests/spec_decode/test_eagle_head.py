"""fd's EAGLE head and proposer (`"method": "eagle"`) against a plain torch composition of vLLM's
EagleLlamaForCausalLM (llama_eagle.py): u = fc([embed(x_{j+1}), h_j]) with h_j the target's final
hidden state (transformers' output_hidden_states, last entry), then the head's Llama decoder layer(s)
with layer 0's input norm removed and no final norm (transformers' LlamaModel with those two norms
replaced by identities), then the lm_head (the head's own where stored, else the target's); each further draft feeds the head's own output
back as h. Tiny random target and head; tolerance: logits within atol 1e-4 (fp32 summation order),
drafts identical. With every draft taken as accepted, the drafts of every step (chunked prompts,
prefix-cache hits, preemption) equal the head run from scratch over the whole sequence."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from ops_backend import switched_ops
from proposer_loop import PROMPTS, SCENARIOS, SpecLoop, paddle_ids, plain_greedy, run_scenario
from safetensors.numpy import load_file, save_file
from tiny_models import load_hf_model, make_attention_metadata, make_tiny_checkpoint, make_tiny_eagle

from fdcli_engine.config import EngineConfig
from fdcli_engine.config_resolver import resolve_config
from fdcli_engine.errors import ConfigError
from fdcli_engine.loader import load_model
from fdcli_engine.runner.eagle_proposer import EagleProposer

PROMPT = [5, 17, 42, 99, 3, 250, 7, 128, 64, 311]
ATOL = 1e-4
K = 3


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("eagle")
    target = make_tiny_checkpoint("LlamaForCausalLM", root / "target", num_hidden_layers=3)
    return {
        "target": target,
        "shared": make_tiny_eagle(root / "shared", target),  # the target's embedding
        "own": make_tiny_eagle(root / "own", target, seed=6, embed=True, fc_bias=True),  # + lm_head
        "deep": make_tiny_eagle(root / "deep", target, seed=7, num_hidden_layers=2),
    }


def eagle_config(folders, head: str, k: int = K, **spec):
    model = str(folders[head]) if head in folders else head
    return resolve_config(
        EngineConfig(
            model=str(folders["target"]),
            speculative_config={"method": "eagle", "model": model, "num_speculative_tokens": k, **spec},
        )
    )


def reference_eagle(hf, head_folder, tokens: list[int], extra: int) -> tuple[np.ndarray, list[int]]:
    """Logits of the head's rows over `tokens` (positions 0..n-2 take tokens[1:] and the target's
    hidden states h_0..h_{n-2}), then greedy drafts continuing with the head's own output for `extra`
    more rows; returns (logits of the first rows, the 1 + extra drafts)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaModel

    cfg = json.loads((head_folder / "config.json").read_text())
    head = {k: torch.from_numpy(v) for k, v in load_file(head_folder / "model.safetensors").items()}
    config = LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "rope_theta")})
    config.rope_parameters = {"rope_theta": cfg["rope_theta"], "rope_type": "default"}
    config._attn_implementation = "eager"
    block = LlamaModel(config).eval()
    missing, unexpected = block.load_state_dict(
        {k: v for k, v in head.items() if k.startswith("layers.")}, strict=False
    )
    assert not unexpected and set(missing) == {
        "embed_tokens.weight",
        "norm.weight",
        "layers.0.input_layernorm.weight",
    }
    block.layers[0].input_layernorm = torch.nn.Identity()  # vLLM: disable_input_layernorm for layer 0
    block.norm = torch.nn.Identity()  # vLLM returns hidden_states + residual
    embed = head.get("embed_tokens.weight", hf.model.embed_tokens.weight)

    def rows(next_ids, hidden):
        x = torch.cat([embed[torch.tensor(next_ids)], hidden], dim=-1)
        return torch.nn.functional.linear(x, head["fc.weight"], head.get("fc.bias"))

    with torch.no_grad():
        h = hf(torch.tensor([tokens]), output_hidden_states=True).hidden_states[-1][0]
        u = rows(tokens[1:], h[:-1])
        out = block(inputs_embeds=u[None]).last_hidden_state[0]
        lm_head = head.get("lm_head.weight", hf.lm_head.weight)  # the head's own where stored
        logits = out @ lm_head.T
        drafts = [int(logits[-1].argmax())]
        for _ in range(extra):
            u = torch.cat([u, rows([drafts[-1]], out[-1:])])
            out = block(inputs_embeds=u[None]).last_hidden_state[0]
            drafts.append(int((out[-1] @ lm_head.T).argmax()))
    return logits.numpy(), drafts


@pytest.fixture(params=["reference", "auto"])
def backend(request):
    yield from switched_ops(request.param)


@pytest.mark.parametrize("head", ["shared", "own", "deep"])
def test_eagle_head_matches_vllm_structure(folders, head, backend):
    cfg = eagle_config(folders, head)
    target = load_model(cfg)
    proposer = EagleProposer(cfg, target)
    assert (proposer.model.embed_tokens is target.embed_tokens) == (head != "own")
    assert (proposer.model.lm_head is target.lm_head) == (head != "own")
    hf = load_hf_model(folders["target"])
    with torch.no_grad():
        first = int(hf(torch.tensor([PROMPT])).logits[0, -1].argmax())
    ref_logits, ref_drafts = reference_eagle(hf, folders[head], PROMPT + [first], extra=K - 1)

    loop = SpecLoop(target, proposer, k=K)
    loop.add("r", PROMPT, max_tokens=8)
    loop.step()  # the whole prompt: the target samples `first`, the head drafts K tokens
    assert loop.seqs["r"].output == [first]
    assert loop.seqs["r"].drafts == ref_drafts

    # The head's logits of every prompt row, through the same KV cache slots.
    rs = loop.seqs["r"]
    meta, positions = make_attention_metadata([(0, len(PROMPT), rs.block_ids)], loop.block_size)
    hidden = target.forward(paddle_ids(PROMPT), positions, loop.kv, meta)
    out = proposer.model.forward(
        paddle_ids(PROMPT[1:] + [first]), hidden, positions, proposer.kv_caches, meta
    )
    np.testing.assert_allclose(proposer.model.compute_logits(out).numpy(), ref_logits, atol=ATOL)


@pytest.fixture(scope="module")
def target(folders):
    return load_model(eagle_config(folders, "shared"))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_random_eagle_head_changes_no_token(folders, target, scenario):
    loop = run_scenario(target, EagleProposer(eagle_config(folders, "own"), target), K, scenario)
    for rid, seq in loop.seqs.items():
        assert seq.output == plain_greedy(target, seq.prompt, len(seq.output)), rid
    assert loop.num_draft_tokens > 10
    assert loop.num_accepted <= loop.num_draft_tokens


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_drafts_equal_the_head_run_from_scratch(folders, target, scenario):
    hf = load_hf_model(folders["target"])
    checked = []

    def check(loop):
        for rid, seq in loop.seqs.items():
            if seq.drafts and not seq.done:  # a finished one's last tokens were cut at max_tokens
                _, ref = reference_eagle(hf, folders["deep"], seq.tokens, extra=len(seq.drafts) - 1)
                assert seq.drafts == ref, (rid, len(seq.tokens))
                checked.append(rid)

    proposer = EagleProposer(eagle_config(folders, "deep"), target)
    loop = run_scenario(target, proposer, K, scenario, check, accept_all=True)
    assert loop.num_accepted == loop.num_draft_tokens > 10
    assert len(checked) >= 6
    assert set(checked) == set(loop.seqs) and set(loop.seqs) <= set(PROMPTS)


def rewrite_head(src, dst, drop=(), add=None, **config):
    """A copy of the head in `src` without the tensors `drop`, with `add` and config keys changed."""
    dst.mkdir()
    cfg = {**json.loads((src / "config.json").read_text()), **config}
    (dst / "config.json").write_text(json.dumps(cfg))
    tensors = {k: v for k, v in load_file(src / "model.safetensors").items() if k not in drop}
    save_file({**tensors, **(add or {})}, str(dst / "model.safetensors"))
    return dst


def bad_heads(folders, tmp_path):
    src = folders["shared"]
    wide = make_tiny_eagle(tmp_path / "wide", folders["target"], hidden_size=32)
    bin_only = tmp_path / "bin"
    bin_only.mkdir()
    (bin_only / "config.json").write_text((src / "config.json").read_text())
    (bin_only / "pytorch_model.bin").write_bytes(b"")
    return [
        (wide, "the EAGLE head {} has hidden_size 32, the target 64: use a head trained for this target"),
        (
            rewrite_head(src, tmp_path / "vocab", vocab_size=1000),
            "the EAGLE head {} has vocab_size 1000, the target 512",
        ),
        (
            rewrite_head(src, tmp_path / "lacks", drop=("fc.weight",)),
            "the EAGLE head lacks tensor(s): fc.weight",
        ),
        (
            rewrite_head(src, tmp_path / "extra", add={"layers.0.mlp.extra.weight": np.zeros(4, np.float32)}),
            "tensor layers.0.mlp.extra.weight is not part of an EAGLE head",
        ),
        (
            rewrite_head(
                src, tmp_path / "embed", add={"embed_tokens.weight": np.zeros((100, 64), np.float32)}
            ),
            "embed_tokens.weight is [100, 64], the target's embedding [512, 64]",
        ),
        (bin_only, "the head is stored as pytorch_model.bin, and fd reads safetensors only: convert it"),
        (tmp_path / "absent", "absent"),
    ]


def test_bad_heads_are_one_line_errors(folders, target, tmp_path):
    for folder, message in bad_heads(folders, tmp_path):
        with pytest.raises(ConfigError) as err:
            EagleProposer(eagle_config(folders, str(folder)), target)
        text = str(err.value)
        assert text.startswith("--speculative-config: "), text
        assert message.format(folder) in text, text
        assert "\n" not in text
