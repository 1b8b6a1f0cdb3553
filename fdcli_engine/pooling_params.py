"""Per-request pooling parameters. Leaf module.

A request carries either SamplingParams (it generates text) or PoolingParams (it is pooled: one
vector or per-token scores, no tokens generated); its kind is read from which one it holds. The
pooler itself (pooling mode, normalization) is fixed per model by `--pooler-config`, and the
request-level `normalize` / `dimensions` (vLLM's PoolingParams fields, embedding models only) are
applied by the front end to the raw pool (pooling/postprocess.py); the engine ignores them. The one
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
    # vLLM's: matryoshka truncation (a model trained for it only) and L2 normalization of an
    # embedding; None: the model's --pooler-config default.
    dimensions: int | None = None
    normalize: bool | None = None
