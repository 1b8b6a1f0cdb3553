"""Chained block hashes for prefix caching.

A block's hash covers its parent's hash and its own token ids (and, for a request's first block, its
cache salt), so equal hashes mean equal whole prefixes. A keyed BLAKE2b with a secret drawn when the
process starts: Python's `hash()` collides easily on crafted inputs, and a collision would serve one
user's cached K/V to another's prompt; the key keeps a client from computing any block's hash, so it
cannot aim a collision or a probe at another tenant's blocks (vLLM's CVE-2025-25183 and
CVE-2025-46570 are this class). Hashes mean nothing outside the process that made them, unless the
process takes a stored key with `set_key` (the KV offload file tier keeps one, 0600, beside its files, so
its blocks keep their names across restarts); that must happen before any request is hashed.
"""

from __future__ import annotations

import hashlib
import secrets
from array import array

_KEY = secrets.token_bytes(32)
_ROOT = b"fd-prefix-v2"


def set_key(key: bytes) -> None:
    """Hash with this 32-byte secret from now on."""
    global _KEY
    if len(key) != 32:
        raise ValueError("a prefix-hash key is 32 bytes")
    _KEY = bytes(key)


def hash_block_tokens(parent_hash: bytes | None, token_ids, extra: bytes = b"") -> bytes:
    h = hashlib.blake2b(key=_KEY, digest_size=32)
    h.update(parent_hash if parent_hash is not None else _ROOT)
    h.update(array("q", token_ids).tobytes())
    if extra:
        h.update(len(extra).to_bytes(4, "little"))  # a length prefix: salts never run into each other
        h.update(extra)
    return h.digest()
