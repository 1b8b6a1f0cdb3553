"""The draft_model proposer over a tiny Llama target, driven by proposer_loop.SpecLoop (greedy
verification by exact match): the tokens are the target's own greedy ones whatever the draft, with
chunked prompts, prefix-cache hits and preemption; the target as its own draft has every draft
accepted (its cache then holds exactly the target's K/V); a draft of another vocabulary is refused."""

from __future__ import annotations

import shutil

import pytest
from proposer_loop import PROMPTS, SCENARIOS, plain_greedy, run_scenario
from tiny_models import make_tiny_checkpoint, write_tiny_tokenizer

from fdcli_engine.config import EngineConfig
from fdcli_engine.config_resolver import resolve_config
from fdcli_engine.errors import ConfigError
from fdcli_engine.loader import load_model
from fdcli_engine.runner.draft_model_proposer import DraftModelProposer, draft_quantization

K = 3


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("draft")
    target = make_tiny_checkpoint("LlamaForCausalLM", root / "target")
    write_tiny_tokenizer(target)
    shutil.copytree(target, root / "copy")
    return {
        "target": target,
        "copy": root / "copy",  # the same weights under another path: loaded on their own
        "small": make_tiny_checkpoint("LlamaForCausalLM", root / "small", seed=3, num_hidden_layers=1),
        "qwen": make_tiny_checkpoint("Qwen2ForCausalLM", root / "qwen", seed=4, num_hidden_layers=1),
        "vocab": make_tiny_checkpoint("LlamaForCausalLM", root / "vocab", seed=5, vocab_size=640),
        "short": make_tiny_checkpoint("LlamaForCausalLM", root / "short", max_position_embeddings=64),
    }


def draft_config(folders, draft: str, **options):
    spec = {"method": "draft_model", "model": str(folders[draft]), "num_speculative_tokens": K}
    return resolve_config(EngineConfig(model=str(folders["target"]), speculative_config=spec, **options))


@pytest.fixture(scope="module")
def target(folders):
    return load_model(draft_config(folders, "target"))


@pytest.fixture(scope="module")
def references(target):
    refs = {rid: plain_greedy(target, p, 10) for rid, p in PROMPTS.items()}
    refs["prefix-b"] = plain_greedy(target, PROMPTS["a"][:10] + [77, 78], 10)
    return refs


def expected(scenario, refs):
    if scenario == "prefix":
        return {"a": refs["a"], "b": refs["prefix-b"]}
    if scenario == "preempt":
        return {"a": refs["a"], "b": refs["b"]}
    return {rid: refs[rid] for rid in PROMPTS}


@pytest.mark.parametrize("own", ["target", "copy"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_target_as_its_own_draft_accepts_every_draft(folders, target, references, scenario, own):
    proposer = DraftModelProposer(draft_config(folders, own), target)
    assert (proposer.model is target) == (own == "target")  # the same file shares the weights
    loop = run_scenario(target, proposer, K, scenario)
    assert {rid: s.output for rid, s in loop.seqs.items()} == expected(scenario, references)
    assert loop.num_draft_tokens > 10
    assert loop.num_accepted == loop.num_draft_tokens


@pytest.mark.parametrize("draft", ["small", "qwen"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_another_draft_changes_no_token(folders, target, references, draft, scenario):
    proposer = DraftModelProposer(draft_config(folders, draft), target)
    loop = run_scenario(target, proposer, K, scenario)
    assert {rid: s.output for rid, s in loop.seqs.items()} == expected(scenario, references)
    assert loop.num_draft_tokens > 10
    assert loop.num_accepted < loop.num_draft_tokens


def test_draft_with_another_vocabulary_is_refused(folders, target):
    with pytest.raises(
        ConfigError, match=r"^--speculative-config: the draft model .* 640 tokens, the target 512"
    ):
        DraftModelProposer(draft_config(folders, "vocab"), target)


def test_draft_with_a_shorter_context_is_refused(folders, target):
    with pytest.raises(ConfigError, match=r"handles 64 positions, fewer than --max-model-len 256"):
        DraftModelProposer(draft_config(folders, "short"), target)
    DraftModelProposer(draft_config(folders, "short", max_model_len=64), target)


def test_draft_quantization():
    assert draft_quantization(None, "wint8", is_gguf=False) == "wint8"
    assert draft_quantization(None, "gguf", is_gguf=False) is None
    assert draft_quantization(None, None, is_gguf=True) == "gguf"
    assert draft_quantization("none", None, is_gguf=True) is None
    with pytest.raises(ConfigError, match='"gguf" needs a .gguf draft'):
        draft_quantization("gguf", None, is_gguf=False)
    with pytest.raises(ConfigError, match="quantization 'fp8' is not supported"):
        draft_quantization("fp8", None, is_gguf=False)


def test_missing_draft_model_is_refused(folders, tmp_path):
    folders = {**folders, "missing": tmp_path / "nowhere"}
    with pytest.raises(
        ConfigError, match=r"^--speculative-config: draft model path .*nowhere' does not exist"
    ):
        DraftModelProposer(draft_config(folders, "missing"), None)
