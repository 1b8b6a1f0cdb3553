"""A Hugging Face model id (`Qwen/Qwen2.5-0.5B-Instruct`) given where a path belongs, found in the local
Hugging Face cache the way vLLM finds it offline: fd never downloads, so a model a vLLM user has already
fetched (`hf download`, or an earlier `vllm serve`) serves under the same launch line, and one that is
not there is a one-line error saying how to fetch it.

The cache is huggingface_hub's (`HF_HUB_CACHE`, else `HF_HOME/hub`, else ~/.cache/huggingface/hub), or
the folder given as vLLM's `--download-dir`; the snapshot is the one `--revision` names (a branch, tag
or commit hash; default main)."""

from __future__ import annotations

import re
from pathlib import Path

from fdcli_engine.errors import ConfigError

# huggingface_hub's repo id grammar: a name, or namespace/name, of letters, digits, '-', '_' and '.'.
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


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
