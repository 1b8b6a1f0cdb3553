"""Per-request pooling parameters. Leaf module.

A request carries either SamplingParams (it generates text) or PoolingParams (it is pooled: one
vector or per-token scores, no tokens generated); its kind is read from which one it holds. The
pooler itself (pooling mode, normalization) is fixed per model by `--pooler-config`, and the
request-level `normalize` / `dimensions` are applied by the serving layer to the raw pool. The one
thing the engine needs besides the token ids is where a text pair's second segment starts, for
encoders whose token-type embeddings tell the segments apart (a BERT cross-encoder scoring a pair).
"""

from __future__ import annotations

import msgspec


class PoolingParams(msgspec.Struct, frozen=True, omit_defaults=True):
    """What a pooling request asks of the engine (see the module doc)."""

    # First position of the second segment of a text pair (token type 1 from here to the end, as
    # vLLM's compressed token type ids); None: one segment, every token type 0.
    token_type_start: int | None = None
