"""A Hugging Face model id where a path belongs (`fd serve Qwen/Qwen2.5-0.5B-Instruct`, `LLM("org/name")`):
served from the local Hugging Face cache, in huggingface_hub's own layout, as vLLM serves it offline;
an id the cache lacks is one ConfigError, never a download."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fdcli_engine import LLM, SamplingParams
from fdcli_engine.config import resolve_model_path
from fdcli_engine.errors import ConfigError

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OLD = "fedcba9876543210fedcba9876543210fedcba98"
REPO = "fd-test/tiny-llama"


@pytest.fixture(scope="module")
def hub(tiny_model_dir, tmp_path_factory) -> Path:
    """A hub cache holding REPO: main -> COMMIT (the tiny model), tag v1 -> OLD (a copy)."""
    cache = tmp_path_factory.mktemp("hub")
    repo = cache / ("models--" + REPO.replace("/", "--"))
    for commit in (COMMIT, OLD):
        shutil.copytree(tiny_model_dir("LlamaForCausalLM"), repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    (repo / "refs" / "v1").write_text(OLD)
    return cache


@pytest.mark.parametrize("revision, commit", [(None, COMMIT), ("main", COMMIT), ("v1", OLD), (OLD, OLD)])
def test_an_id_resolves_to_its_cached_snapshot(hub, revision, commit):
    path = resolve_model_path(REPO, revision, str(hub))
    assert path == hub / ("models--" + REPO.replace("/", "--")) / "snapshots" / commit


@pytest.mark.parametrize("model, revision", [("fd-test/absent", None), (REPO, "v2"), ("absent", None)])
def test_an_id_the_cache_lacks_is_one_error_line(hub, model, revision):
    with pytest.raises(ConfigError) as e:
        resolve_model_path(model, revision, str(hub))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{model!r} is neither a file or folder here nor in")
    assert str(hub) in msg and "fd never downloads" in msg and f"hf download {model}" in msg


def test_a_path_that_does_not_exist_is_not_looked_up(hub):
    with pytest.raises(ConfigError, match="model path '/no/such/model' does not exist"):
        resolve_model_path("/no/such/model", None, str(hub))


def test_llm_serves_the_cached_id_as_its_path(hub, tiny_model_dir):
    """Greedy tokens of LLM("org/name", download_dir=cache) equal those of the checkpoint's folder."""
    kw = {"max_model_len": 128, "block_size": 8, "num_kv_blocks": 32}
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    by_id = LLM(REPO, download_dir=str(hub), **kw).generate(["hello world"], greedy)
    by_path = LLM(str(tiny_model_dir("LlamaForCausalLM")), **kw).generate(["hello world"], greedy)
    assert by_id[0].outputs[0].token_ids == by_path[0].outputs[0].token_ids


def test_cli_reads_hf_hub_cache(hub):
    """`fd tokenizer encode --model org/name` with HF_HUB_CACHE set: the cached model's tokenizer."""
    env = {**os.environ, "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1"}
    fd = [sys.executable, "-m", "fdcli.main"]
    out = subprocess.run(
        [*fd, "tokenizer", "encode", "--model", REPO, "hello"], env=env, capture_output=True, text=True
    )
    ref = subprocess.run(
        [*fd, "tokenizer", "encode", "--model", str(resolve_model_path(REPO, None, str(hub))), "hello"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0 and out.stdout == ref.stdout and out.stdout.startswith("["), out.stderr
    bad = subprocess.run(
        [*fd, "tokenizer", "encode", "--model", "fd-test/absent", "hi"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0 and bad.stderr.count("\n") == 1 and "fd never downloads" in bad.stderr, (
        bad.stderr
    )
