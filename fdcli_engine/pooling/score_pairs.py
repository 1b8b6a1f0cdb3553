"""The scoring rules `fd serve`'s /v1/score and /rerank and the offline `LLM.score` share, as vLLM's
both do: how two text lists pair up, and how a cross-encoder reads and scores one pair."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.pooling.config import PoolerConfig
from fdcli_engine.pooling.postprocess import postprocess, sigmoid
from fdcli_engine.pooling_params import PoolingParams


def pair_up(first: Sequence, second: Sequence, names: tuple[str, str], param: str) -> list[tuple]:
    """One item of `first` against each of `second`, or two lists of one length zipped (vLLM's
    rule); InvalidRequestError naming `param` otherwise."""
    if len(first) == 1:
        first = list(first) * len(second)
    elif len(first) != len(second):
        one, other = names
        raise InvalidRequestError(
            f"{one} has {len(first)} texts and {other} {len(second)}: give one {one}, or as many as {other}",
            param=param,
        )
    return list(zip(first, second))


def cross_encoder_input(tokenizer, a: str, b: str, limit: int | None) -> tuple[list[int], PoolingParams]:
    """The pair as one sequence in the tokenizer's pair template (BERT: [CLS] a [SEP] b [SEP], b with
    token type 1), cut to `limit`, and the pooling params that carry where b's token types start."""
    ids, types = tokenizer.encode_pair(a, b, limit)
    return ids, PoolingParams(token_type_start=types.index(1) if 1 in types else None)


def cross_encoder_score(pooled: Any, pc: PoolerConfig, activation: bool = True) -> float:
    """sigmoid of the one label's logit: sentence-transformers' CrossEncoder default for one label,
    which vLLM applies too; the logit itself without `activation` (vLLM's use_activation false)."""
    logit = postprocess(pooled, pc).reshape(-1)[0]
    return float(sigmoid(logit) if activation else logit)
