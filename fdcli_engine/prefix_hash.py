"""Chained block hashes for prefix caching.

A block's hash covers its parent's hash and its own token ids, so equal hashes mean equal whole
prefixes. SHA-256 rather than Python's `hash()`: the latter is seeded per process and collides easily on
crafted inputs, and a collision here would serve one user's cached K/V to another's prompt.
"""

from __future__ import annotations

import hashlib
from array import array

_ROOT = b"fd-prefix-v1"


def hash_block_tokens(parent_hash: bytes | None, token_ids, extra: bytes = b"") -> bytes:
    h = hashlib.sha256()
    h.update(parent_hash if parent_hash is not None else _ROOT)
    h.update(array("q", token_ids).tobytes())
    if extra:
        h.update(extra)
    return h.digest()
