"""fd's EAGLE-3 head and proposer (`"method": "eagle3"`) against a plain torch implementation of vLLM's
Eagle3LlamaForCausalLM (llama_eagle3.py), written out here: the target's hidden states entering layers
(2, n/2, n-3) (transformers' output_hidden_states[i], i = n: the last layer's output before the
final norm; concatenated in layer order) through fc; layer 0
takes concat(input_layernorm(embed(x_{j+1})), hidden_norm(g_j)) into q/k/v, residual g_j (the normed
one with norm_before_residual), attention with the head's rope, post_attention_layernorm fused with the
residual, the gated MLP; logits = lm_head(norm(out + residual)) over the draft vocabulary, placed at
target id d + d2t[d] (the head's own lm_head, or the target's when it has none); each further draft feeds out + residual back as g. Tiny random target (8 layers)
and heads; drafts identical, logits within atol 1e-4 where the draft vocabulary scores."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from ops_backend import switched_ops
from proposer_loop import PROMPTS, SCENARIOS, SpecLoop, paddle_ids, plain_greedy, run_scenario
from safetensors.numpy import load_file
from tiny_models import load_hf_model, make_attention_metadata, make_tiny_checkpoint, make_tiny_eagle3

from fdcli_engine.config import EngineConfig
from fdcli_engine.config_resolver import resolve_config
from fdcli_engine.errors import ConfigError
from fdcli_engine.loader import load_model
from fdcli_engine.runner.eagle_proposer import EagleProposer

PROMPT = [5, 17, 42, 99, 3, 250, 7, 128, 64, 311]
ATOL = 1e-4
K = 3
TARGET_LAYERS = 8  # vLLM's default layers (2, 4, 5) are distinct from 6 layers up


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("eagle3")
    target = make_tiny_checkpoint("LlamaForCausalLM", root / "target", num_hidden_layers=TARGET_LAYERS)
    return {
        "target": target,
        "default": make_tiny_eagle3(root / "default", target),
        "own": make_tiny_eagle3(
            root / "own",
            target,
            seed=9,
            embed=True,
            norm_before_residual=True,
            eagle_aux_hidden_state_layer_ids=[1, 3, 8],
        ),
        # The target's vocabulary and, without an lm_head of its own, the target's LM head.
        "full": make_tiny_eagle3(
            root / "full", target, seed=10, draft_vocab_size=512, d2t=False, lm_head=False
        ),
        "deep": make_tiny_eagle3(root / "deep", target, seed=11, num_hidden_layers=2),
    }


def eagle3_config(folders, head: str, k: int = K):
    model = str(folders[head]) if head in folders else head
    spec = {"method": "eagle3", "model": model, "num_speculative_tokens": k}
    return resolve_config(EngineConfig(model=str(folders["target"]), speculative_config=spec))


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, positions, theta):
    """Neox-style rotary embedding of x [T, heads, d] at `positions`."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = (positions[:, None].double() * inv[None]).float()
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class ReferenceEagle3:
    """vLLM's Eagle3LlamaForCausalLM in plain torch, over whole sequences (no cache)."""

    def __init__(self, hf, folder):
        self.hf = hf
        self.cfg = json.loads((folder / "config.json").read_text())
        self.w = {
            k.replace("midlayer.", "layers.0."): torch.from_numpy(np.asarray(v))
            for k, v in load_file(folder / "model.safetensors").items()
        }
        n = hf.config.num_hidden_layers
        self.aux = sorted(set(self.cfg.get("eagle_aux_hidden_state_layer_ids") or (2, n // 2, n - 3)))
        dv, v = self.cfg["draft_vocab_size"], self.cfg["vocab_size"]
        d2t = self.w.get("d2t", torch.zeros(dv, dtype=torch.long))
        self.targets = torch.arange(dv) + d2t
        self.vocab = v
        self.embed = self.w.get("embed_tokens.weight", hf.model.embed_tokens.weight)

    def layer(self, i, x, residual):
        c, w, p = self.cfg, self.w, f"layers.{i}."
        eps, nh, nkv = c["rms_norm_eps"], c["num_attention_heads"], c["num_key_value_heads"]
        d = c["hidden_size"] // nh
        t = x.shape[0]
        pos = torch.arange(t)
        q = rope((x @ w[p + "self_attn.q_proj.weight"].T).view(t, nh, d), pos, c["rope_theta"])
        k = rope((x @ w[p + "self_attn.k_proj.weight"].T).view(t, nkv, d), pos, c["rope_theta"])
        v = (x @ w[p + "self_attn.v_proj.weight"].T).view(t, nkv, d)
        k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * d**-0.5
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        a = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(t, nh * d)
        residual = a @ w[p + "self_attn.o_proj.weight"].T + residual
        x = rms(residual, w[p + "post_attention_layernorm.weight"], eps)
        gate, up = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
        return (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T, residual

    def forward(self, next_ids, g):
        """Rows at positions 0..T-1: tokens next_ids, hidden g. Returns (logits over the target vocab,
        the pre-norm output)."""
        c, w, eps = self.cfg, self.w, self.cfg["rms_norm_eps"]
        e = rms(self.embed[torch.tensor(next_ids)], w["layers.0.input_layernorm.weight"], eps)
        n = rms(g, w["layers.0.hidden_norm.weight"], eps)
        residual = n if c.get("norm_before_residual") else g
        hidden, residual = self.layer(0, torch.cat([e, n], -1), residual)
        for i in range(1, c["num_hidden_layers"]):
            residual = hidden + residual
            hidden, residual = self.layer(
                i, rms(residual, w[f"layers.{i}.input_layernorm.weight"], eps), residual
            )
        out = hidden + residual
        lm_head = w.get("lm_head.weight", self.hf.lm_head.weight)
        draft_logits = rms(out, w["norm.weight"], eps) @ lm_head.T
        logits = torch.full((out.shape[0], self.vocab), float("-inf"))
        logits[:, self.targets] = draft_logits
        return logits, out

    def target_hidden_states(self, tokens: list[int]):
        """transformers' output_hidden_states, but the last entry before the final norm (vLLM's layer n:
        the last layer's output), caught from the last decoder layer."""
        caught = []
        hook = self.hf.model.layers[-1].register_forward_hook(
            lambda module, args, out: caught.append(out[0] if isinstance(out, tuple) else out)
        )
        try:
            hs = self.hf(torch.tensor([tokens]), output_hidden_states=True).hidden_states
        finally:
            hook.remove()
        return (*hs[:-1], caught[0])

    def run(self, tokens: list[int], extra: int) -> tuple[np.ndarray, list[int]]:
        with torch.no_grad():
            hs = list(self.target_hidden_states(tokens))
            g = torch.cat([hs[i][0] for i in self.aux], -1)[:-1] @ self.w["fc.weight"].T
            ids = tokens[1:]
            logits, out = self.forward(ids, g)
            drafts = [int(logits[-1].argmax())]
            first = logits.numpy()
            for _ in range(extra):
                ids, g = [*ids, drafts[-1]], torch.cat([g, out[-1:]])
                logits, out = self.forward(ids, g)
                drafts.append(int(logits[-1].argmax()))
        return first, drafts


@pytest.fixture(params=["reference", "auto"])
def backend(request):
    yield from switched_ops(request.param)


@pytest.mark.parametrize("head", ["default", "own", "full", "deep"])
def test_eagle3_head_matches_vllm_structure(folders, head, backend):
    cfg = eagle3_config(folders, head)
    target = load_model(cfg)
    proposer = EagleProposer(cfg, target)
    assert (proposer.model.embed_tokens is target.embed_tokens) == (head != "own")
    assert (proposer.model.lm_head is target.lm_head) == (head == "full")
    hf = load_hf_model(folders["target"])
    with torch.no_grad():
        first = int(hf(torch.tensor([PROMPT])).logits[0, -1].argmax())
    ref = ReferenceEagle3(hf, folders[head])
    ref_logits, ref_drafts = ref.run(PROMPT + [first], extra=K - 1)
    assert all(d in ref.targets.tolist() for d in ref_drafts)  # drafts are target ids of draft tokens

    loop = SpecLoop(target, proposer, k=K)
    loop.add("r", PROMPT, max_tokens=8)
    loop.step()  # the whole prompt: the target samples `first`, the head drafts K tokens
    assert loop.seqs["r"].output == [first]
    assert loop.seqs["r"].drafts == ref_drafts

    # The head's logits of every prompt row, through the same KV cache slots.
    rs = loop.seqs["r"]
    meta, positions = make_attention_metadata([(0, len(PROMPT), rs.block_ids)], loop.block_size)
    target.forward(paddle_ids(PROMPT), positions, loop.kv, meta)
    g = proposer.model.combine_hidden_states(target.aux_hidden_states)
    out = proposer.model.forward(paddle_ids(PROMPT[1:] + [first]), g, positions, proposer.kv_caches, meta)
    logits = proposer.model.compute_logits(out).numpy()
    scored = np.isfinite(ref_logits)
    assert (np.isfinite(logits) == scored).all()
    np.testing.assert_allclose(logits[scored], ref_logits[scored], atol=ATOL)


@pytest.fixture(scope="module")
def target(folders):
    return load_model(eagle3_config(folders, "default"))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_random_eagle3_head_changes_no_token(folders, target, scenario):
    loop = run_scenario(target, EagleProposer(eagle3_config(folders, "default"), target), K, scenario)
    for rid, seq in loop.seqs.items():
        assert seq.output == plain_greedy(target, seq.prompt, len(seq.output)), rid
    assert loop.num_draft_tokens > 10


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_drafts_equal_the_head_run_from_scratch(folders, target, scenario):
    ref = ReferenceEagle3(load_hf_model(folders["target"]), folders["own"])
    checked = []

    def check(loop):
        for rid, seq in loop.seqs.items():
            if seq.drafts and not seq.done:  # a finished one's last tokens were cut at max_tokens
                assert seq.drafts == ref.run(seq.tokens, extra=len(seq.drafts) - 1)[1], (rid, len(seq.tokens))
                checked.append(rid)

    proposer = EagleProposer(eagle3_config(folders, "own"), target)
    loop = run_scenario(target, proposer, K, scenario, check, accept_all=True)
    assert loop.num_accepted == loop.num_draft_tokens > 10
    assert len(checked) >= 6
    assert set(checked) == set(loop.seqs) and set(loop.seqs) <= set(PROMPTS)


def test_bad_heads_are_one_line_errors(folders, target, tmp_path):
    bad = [
        (
            make_tiny_eagle3(
                tmp_path / "layers", folders["target"], eagle_aux_hidden_state_layer_ids=[1, 1, 2]
            ),
            "reads target layers [1, 1, 2], which the 8-layer target does not have as three distinct layers",
        ),
        (
            make_tiny_eagle3(
                tmp_path / "deep", folders["target"], eagle_aux_hidden_state_layer_ids=[1, 2, 9]
            ),
            "reads target layers [1, 2, 9], which the 8-layer target does not have as three distinct "
            "layers: name three of 0..8",
        ),
        (
            make_tiny_eagle3(tmp_path / "wide", folders["target"], target_hidden_size=32),
            "has target_hidden_size 32, the target 64: use a head trained for this target model",
        ),
        (
            make_tiny_eagle3(tmp_path / "narrow", folders["target"], hidden_size=32),
            "has hidden_size 32, the target 64",
        ),
        (
            make_tiny_eagle3(tmp_path / "big", folders["target"], draft_vocab_size=600, d2t=False),
            "has draft_vocab_size 600, more than the target's 512 tokens",
        ),
        (
            make_tiny_eagle3(tmp_path / "headless", folders["target"], lm_head=False),
            "the EAGLE-3 head lacks lm_head.weight, which a draft vocabulary of 200 tokens (not the target's 512)",
        ),
        (
            make_tiny_eagle3(tmp_path / "small", folders["target"], draft_vocab_size=100, d2t=False),
            "tensor lm_head.weight: lm_head shape (100, 64) != expected (200, 64)",
        ),
    ]
    (tmp_path / "small" / "config.json").write_text(
        (tmp_path / "small" / "config.json")
        .read_text()
        .replace('"draft_vocab_size": 100', '"draft_vocab_size": 200')
    )
    for folder, message in bad:
        with pytest.raises(ConfigError) as err:
            EagleProposer(eagle3_config(folders, str(folder)), target)
        text = str(err.value)
        assert text.startswith("--speculative-config: ") and "\n" not in text, text
        assert message in text, text


def test_a_target_whose_forward_keeps_no_layer_states_is_refused(target, monkeypatch):
    from fdcli_engine.models.ernie4_5_vl import Ernie4_5_VLMoeForConditionalGeneration
    from fdcli_engine.runner.eagle_proposer import check_aux_layers

    assert Ernie4_5_VLMoeForConditionalGeneration.keeps_aux_hidden_states is False  # its own layer loop
    monkeypatch.setattr(type(target), "keeps_aux_hidden_states", False)
    with pytest.raises(ConfigError, match="which fd does not keep for LlamaForCausalLM: use eagle or ngram"):
        check_aux_layers("h", {}, target)
