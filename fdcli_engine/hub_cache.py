"""A Hugging Face model id (`Qwen/Qwen2.5-0.5B-Instruct`) given where a path belongs, found in the local
Hugging Face cache the way vLLM finds it offline: fd never downloads, so a model a vLLM user has already
fetched (`hf download`, or an earlier `vllm serve`) serves under the same launch line, and one that is
not there is a one-line error saying how to fetch it.

The cache is huggingface_hub's (`HF_HUB_CACHE`, else `HF_HOME/hub`, else ~/.cache/huggingface/hub), or
the folder given as vLLM's `--download-dir`; the snapshot is the one `--revision` names (a branch, tag
or commit hash; default main).

vLLM's GGUF form `repo_id:QUANT` (`unsloth/Qwen3-0.6B-GGUF:Q4_K_M`) names one .gguf file of a repository
holding several: the one vLLM's gguf_utils.get_gguf_file_path_from_hf picks (patterns below, fewest
dashes first), here among the cached snapshot's files."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

from fdcli_engine.errors import ConfigError

# huggingface_hub's repo id grammar: a name, or namespace/name, of letters, digits, '-', '_' and '.'.
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


# vLLM's is_remote_gguf (vllm/transformers_utils/gguf_utils.py): namespace/name:QUANT.
_REMOTE_GGUF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*:[A-Za-z0-9_+-]+")
# File-name suffixes on a GGML type (Q4_K_M is Q4_K's medium mix), as vLLM's is_valid_gguf_quant_type.
_QUANT_SUFFIXES = ("_M", "_S", "_L", "_XL", "_XS", "_XXS")
# llama.cpp's split files: name-00001-of-00003.gguf.
_SPLIT = re.compile(r"-\d{5}-of-\d{5}\.gguf$")


def split_remote_gguf(model: str) -> tuple[str, str] | None:
    """(repo id, quant) of vLLM's `repo_id:QUANT` form; None for anything else."""
    if not _REMOTE_GGUF.fullmatch(model):
        return None
    repo_id, quant = model.rsplit(":", 1)
    return repo_id, quant


def is_gguf_quant_type(quant: str) -> bool:
    """A GGML type (Q8_0, IQ1_S), with a size suffix (Q4_K_M), or after a dash-separated prefix
    (UD-Q4_K_XL): vLLM's is_valid_gguf_quant_type and is_nonstandard_gguf_quant_type."""
    from gguf.constants import GGMLQuantizationType

    names = set(GGMLQuantizationType.__members__)
    base = quant.rsplit("-", 1)[-1]
    return base in names or any(base.endswith(s) and base[: -len(s)] in names for s in _QUANT_SUFFIXES)


def _file_quant(name: str) -> str:
    """The quant a file name ends with (`Qwen3-0.6B-Q4_K_M.gguf` -> Q4_K_M), as the patterns read it."""
    stem = _SPLIT.sub("", name.rsplit("/", 1)[-1]).removesuffix(".gguf")
    return stem.rsplit("-", 1)[-1] if "-" in stem else stem


def cached_gguf_file(
    repo_id: str, quant: str, revision: str | None = None, cache_dir: str | None = None
) -> Path:
    """The cached .gguf file `repo_id:quant` names (module docstring); a ConfigError naming the quants
    the cached snapshot holds when none matches, or when the match is one file of a split model."""
    snapshot = cached_snapshot(repo_id, revision, cache_dir)
    files = sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*.gguf"))
    patterns = (f"*-{quant}.gguf", f"*-{quant}-*.gguf", f"*/*-{quant}.gguf", f"*/*-{quant}-*.gguf")
    matches = [f for f in files if any(fnmatch.fnmatchcase(f, pat) for pat in patterns)]
    if not matches:
        have = sorted({_file_quant(f) for f in files})
        what = "is not a GGUF quantization type" if not is_gguf_quant_type(quant) else "has no .gguf file"
        held = (
            f"the cached snapshot holds {', '.join(have)}"
            if have
            else "the cached snapshot holds no .gguf file"
        )
        raise ConfigError(
            f"{repo_id}:{quant}: {quant!r} {what} in {repo_id}; {held} (fd never downloads: fetch "
            f"another with `hf download {repo_id} --include '*{quant}*.gguf'`)"
        )
    chosen = min(matches, key=lambda f: (f.count("-"), f))  # vLLM's order: unsplit files first
    if _SPLIT.search(chosen):
        raise ConfigError(
            f"{repo_id}:{quant}: {chosen} is one file of a split GGUF model, which fd does not load: "
            "merge the parts (`llama-gguf-split --merge`) and pass the merged .gguf file"
        )
    return snapshot / chosen


def looks_like_repo_id(model: str) -> bool:
    """Whether `model` could be a hub id rather than a path (no leading '.', '/' or '~', at most one '/')."""
    return bool(_REPO_ID.fullmatch(model)) and not model.endswith((".gguf", ".json"))


def cached_snapshot(repo_id: str, revision: str | None = None, cache_dir: str | None = None) -> Path:
    """The local snapshot folder of `repo_id` at `revision`; ConfigError when the cache does not hold it."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        folder = snapshot_download(repo_id, revision=revision, cache_dir=cache_dir, local_files_only=True)
    except (LocalEntryNotFoundError, HFValidationError, FileNotFoundError, OSError):
        at = f" at revision {revision}" if revision else ""
        raise ConfigError(
            f"{repo_id!r} is neither a file or folder here nor in the Hugging Face cache "
            f"({cache_dir or constants.HF_HUB_CACHE}){at}: fd never downloads; "
            f"fetch it first (`hf download {repo_id}`) or pass the checkpoint's folder or .gguf file"
        ) from None
    return Path(folder)
