"""vLLM's GGUF form `repo_id:QUANT` (`vllm serve unsloth/Qwen3-0.6B-GGUF:Q4_K_M`): the one .gguf file of a
cached repository the quant names, picked by vLLM's rule (gguf_utils.get_gguf_file_path_from_hf: the
patterns *-Q.gguf, *-Q-*.gguf and those one folder down, fewest dashes first); a quant the cache has no
file for is one error naming the quants it has."""

from __future__ import annotations

from pathlib import Path

import pytest
import tiny_models

from fdcli_engine import LLM, SamplingParams
from fdcli_engine.config import resolve_model_path
from fdcli_engine.errors import ConfigError

COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO = "fd-test/tiny-GGUF"


def fake_cache(root: Path, files: dict[str, bytes | Path]) -> Path:
    """A hub cache holding REPO at COMMIT (main) with `files` (relative name -> bytes, or a file to copy)."""
    snapshot = root / ("models--" + REPO.replace("/", "--")) / "snapshots" / COMMIT
    for name, content in files.items():
        (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / name).write_bytes(content.read_bytes() if isinstance(content, Path) else content)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text(COMMIT)
    return root


@pytest.fixture
def several(tmp_path) -> Path:
    names = [
        "tiny-Q4_K_M.gguf",
        "tiny-Q8_0.gguf",
        "tiny-UD-Q4_K_XL.gguf",
        "BF16/tiny-BF16-00001-of-00002.gguf",
        "BF16/tiny-BF16-00002-of-00002.gguf",
        "README.md",
    ]
    return fake_cache(tmp_path, {n: b"GGUF" for n in names})


@pytest.mark.parametrize(
    "quant, chosen",
    [("Q4_K_M", "tiny-Q4_K_M.gguf"), ("Q8_0", "tiny-Q8_0.gguf"), ("UD-Q4_K_XL", "tiny-UD-Q4_K_XL.gguf")],
)
def test_the_quant_picks_its_file(several, quant, chosen):
    path = resolve_model_path(f"{REPO}:{quant}", None, str(several))
    assert path == several / ("models--" + REPO.replace("/", "--")) / "snapshots" / COMMIT / chosen


@pytest.mark.parametrize(
    "quant, what", [("Q5_K_M", "has no .gguf file"), ("Q9_Z", "is not a GGUF quantization type")]
)
def test_a_quant_the_cache_lacks_is_one_error_naming_those_it_has(several, quant, what):
    with pytest.raises(ConfigError) as e:
        resolve_model_path(f"{REPO}:{quant}", None, str(several))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{REPO}:{quant}: {quant!r} {what} in {REPO}")
    assert "the cached snapshot holds BF16, Q4_K_M, Q4_K_XL, Q8_0" in msg and "fd never downloads" in msg


def test_a_split_model_is_refused_naming_the_merge(several):
    with pytest.raises(ConfigError, match="BF16/tiny-BF16-00001-of-00002.gguf is one file of a split GGUF"):
        resolve_model_path(f"{REPO}:BF16", None, str(several))


def test_an_uncached_repo_is_the_hub_caches_own_error(several):
    with pytest.raises(ConfigError, match="'fd-test/absent-GGUF' is neither a file or folder here nor in"):
        resolve_model_path("fd-test/absent-GGUF:Q8_0", None, str(several))


def test_llm_serves_the_chosen_file(tiny_model_dir, tmp_path):
    """Of an F32 and a Q8_0 conversion of the tiny model, `repo:Q8_0` serves the Q8_0 file: its greedy
    tokens are those of LLM(<that file>), and its blocks stay quantized (--quantization auto)."""
    folder = tiny_model_dir("LlamaForCausalLM")
    q8 = tiny_models.make_tiny_gguf(folder, tmp_path / "q8.gguf", "Q8_0")
    f32 = tiny_models.make_tiny_gguf(folder, tmp_path / "f32.gguf", "F32")
    hub = fake_cache(tmp_path / "hub", {"tiny-Q8_0.gguf": q8, "tiny-F32.gguf": f32})
    kw = {"max_model_len": 128, "block_size": 8, "num_kv_blocks": 32, "tokenizer": str(folder)}
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    llm = LLM(f"{REPO}:Q8_0", download_dir=str(hub), **kw)
    assert llm.config.model_path.name == "tiny-Q8_0.gguf" and llm.config.quantization == "gguf"
    by_quant = llm.generate(["hello world"], greedy)[0].outputs[0].token_ids
    assert by_quant == LLM(str(q8), **kw).generate(["hello world"], greedy)[0].outputs[0].token_ids
