"""What makes stored blocks reusable by a later server: the model's identity and the prefix-hash key.

The identity is a digest of everything that shapes a block's bytes or meaning: the model's config, its
files' names, sizes and modification times (contents are not read: a changed file changes its mtime),
the weight and KV dtypes, quantization, block size, loader layout, speculative decoding (a draft
model's caches are part of a block), the offload encoding and each cache tensor's shape and dtype.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from pathlib import Path

KEY_FILE = "prefix-hash.key"


def _files(path: Path | None) -> list[tuple[str, int, int]]:
    if path is None or not path.exists():
        return []
    paths = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
    return [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in paths]


def model_identity(config, views, compression: str | None) -> bytes:
    spec = config.speculative_config
    doc = {
        "config": config.hf_config,
        "files": _files(Path(config.model_path) if config.model_path else None),
        "dtype": config.dtype,
        "quantization": config.quantization,
        "kv_cache_dtype": config.kv_cache_dtype,
        "block_size": config.block_size,
        "layout": config.layout,
        "speculative": spec.describe() if spec is not None else None,
        "compression": compression,
        "tensors": [(list(a.shape[1:]), str(a.dtype)) for a in views.arrays],
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).digest()


def load_or_create_key(root: str | os.PathLike) -> bytes:
    """The directory's 32-byte prefix-hash key, created (mode 0600) on first use."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = root / KEY_FILE
    try:
        key = path.read_bytes()
        if len(key) == 32:
            return key
        os.unlink(path)  # damaged: a new key only makes the old files unreachable
    except FileNotFoundError:
        pass
    key = secrets.token_bytes(32)
    tmp = root / f".tmp-key-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    try:
        os.link(tmp, path)  # never replaces a key another process wrote meanwhile
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    return path.read_bytes()
