"""ERNIE through the public loader and the whole engine: layout detection, both layouts end to end,
batched equals solo, greedy equals transformers, and the clear errors (not a model, tensor
parallelism > 1)."""

from __future__ import annotations

import random
import shutil

import pytest
from ernie_archs import DENSE, MOE
from test_ernie_models import PROMPT, hf_logits
from test_paddle_layout import to_paddle_layout
from tiny_models import PagedRunner, hf_greedy, load_fd_model, load_hf_model

from fdcli_engine import LLM, SamplingParams
from fdcli_engine.config import EngineConfig
from fdcli_engine.errors import ConfigError, ModelLoadError
from fdcli_engine.loader import detect_layout
from fdcli_engine.models.registry import resolve_model_class

GREEDY32 = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


@pytest.fixture(scope="module")
def paddle_moe(ernie_checkpoint, tmp_path_factory):
    hf_folder = ernie_checkpoint(MOE)
    folder = to_paddle_layout(hf_folder, tmp_path_factory.mktemp("paddle_moe") / "ckpt")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(hf_folder / name, folder / name)
    return folder


def test_layout_detection(ernie_checkpoint, paddle_moe):
    assert detect_layout(ernie_checkpoint(MOE))[0] == "hf"
    assert detect_layout(paddle_moe)[0] == "paddle"


def test_both_architecture_spellings_resolve():
    assert resolve_model_class({"architectures": ["Ernie4_5ForCausalLM"]}).__name__ == "Ernie4_5ForCausalLM"
    assert resolve_model_class({"architectures": ["Ernie4_5_ForCausalLM"]}).__name__ == "Ernie4_5ForCausalLM"
    assert resolve_model_class({"architectures": [MOE]}).__name__ == MOE


@pytest.mark.parametrize("arch", [DENSE, MOE])
def test_public_loader_hf_layout_matches_transformers(ernie_checkpoint, arch):
    folder = ernie_checkpoint(arch)
    got = PagedRunner(load_fd_model(folder, quantization=None)).step([("s", PROMPT)])
    assert abs(got - hf_logits(load_hf_model(folder), PROMPT)).max() < 1e-4


def test_public_loader_paddle_layout_matches_transformers(ernie_checkpoint, paddle_moe):
    got = PagedRunner(load_fd_model(paddle_moe, quantization=None)).step([("s", PROMPT)])
    assert abs(got - hf_logits(load_hf_model(ernie_checkpoint(MOE)), PROMPT)).max() < 1e-4


def test_folder_that_is_neither_layout_is_one_clear_line(tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(ModelLoadError) as err:
        detect_layout(tmp_path)
    assert "not a model folder" in str(err.value) and "\n" not in str(err.value)


def test_more_ranks_than_cpus_is_refused():
    with pytest.raises(ConfigError, match="4096 engine rank.* only \\d+ CPU"):
        EngineConfig(tensor_parallel_size=4096).validate()


def prompts_of(n, seed):
    rng = random.Random(seed)
    return [[rng.randrange(3, 300) for _ in range(rng.randint(3, 30))] for _ in range(n)]


def ids(outs):
    return [o.outputs[0].token_ids for o in outs]


def test_engine_moe_batched_equals_solo_and_transformers(paddle_moe, ernie_checkpoint):
    """The Paddle-layout MoE through the engine: 8 mixed-length prompts batched (routing differs per
    token, tokens of different requests share experts) equal each run alone, and transformers'
    greedy generation on the HF-layout checkpoint."""
    prompts = prompts_of(8, seed=4)
    llm = LLM(str(paddle_moe), max_model_len=128, block_size=4, num_kv_blocks=256)
    batched = ids(llm.generate(prompts, GREEDY32))
    solo = [ids(llm.generate([p], GREEDY32))[0] for p in prompts[:3]]
    assert batched[:3] == solo
    hf = load_hf_model(ernie_checkpoint(MOE))
    for p, got in zip(prompts[:2], batched[:2], strict=True):
        assert got == hf_greedy(hf, p, 32)
