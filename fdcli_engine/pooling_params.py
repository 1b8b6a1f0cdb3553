"""Per-request pooling parameters. Leaf module.

A request carries either SamplingParams (it generates text) or PoolingParams (it is pooled: one
vector or per-token scores, no tokens generated); its kind is read from which one it holds. The
pooler itself (pooling mode, normalization) is fixed per model by `--pooler-config`, and the
request-level `normalize` / `dimensions` are applied by the serving layer to the raw pool, so the
engine needs nothing else from a pooling request today.
"""

from __future__ import annotations

import msgspec


class PoolingParams(msgspec.Struct, frozen=True, omit_defaults=True):
    """What a pooling request asks of the engine (nothing beyond its kind, see the module doc)."""
