"""Front-end pooling steps on a raw pool from the engine: matryoshka truncation, L2 normalization,
softmax, and the scores made from pools (cosine, a cross-encoder's sigmoid, class probabilities).
Pure numpy, shared by the server, run-batch and the offline LLM; also the place the request-level
`dimensions` / `normalize` options are validated."""

from __future__ import annotations

import numpy as np

from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.pooling.config import PoolerConfig
from fdcli_engine.pooling_params import PoolingParams


def check_dimensions(dimensions: int | None, pc: PoolerConfig, hidden_size: int) -> int | None:
    """The truncation to apply (None: keep every dimension). A request's `dimensions` is a 400 unless
    the model is matryoshka-trained (truncating other models silently degrades the embedding)."""
    if dimensions is None:
        return pc.dimensions
    if not pc.is_matryoshka:
        raise InvalidRequestError(
            "this model does not support matryoshka representation: `dimensions` cannot be set",
            param="dimensions",
        )
    if not 1 <= dimensions <= hidden_size:
        raise InvalidRequestError(
            f"dimensions must be between 1 and {hidden_size} (the embedding size), got {dimensions}",
            param="dimensions",
        )
    return dimensions


def embedding_options(
    params: PoolingParams, pc: PoolerConfig, hidden_size: int
) -> tuple[int | None, bool | None]:
    """(dimensions, normalize) for `postprocess` from vLLM's PoolingParams fields, which (as in vLLM's
    PoolingParams.verify) only an embedding model takes."""
    if pc.task != "embed":
        given = [name for name in ("dimensions", "normalize") if getattr(params, name) is not None]
        if given:
            raise InvalidRequestError(
                f"{' and '.join(given)} apply to embedding models only; this is a {pc.task} model",
                param=given[0],
            )
        return None, None
    return check_dimensions(params.dimensions, pc, hidden_size), params.normalize


def l2_normalize(x: np.ndarray) -> np.ndarray:
    # float64 norm; the epsilon keeps an all-zero vector at zero (as torch.nn.functional.normalize).
    norm = np.linalg.norm(x.astype(np.float64), axis=-1, keepdims=True)
    return (x / np.maximum(norm, 1e-12)).astype(np.float32)


def softmax(x: np.ndarray) -> np.ndarray:
    z = x.astype(np.float64) - x.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def postprocess(
    raw, pc: PoolerConfig, dimensions: int | None = None, normalize: bool | None = None
) -> np.ndarray:
    """An embedding (task embed) or scores (the other tasks) from the engine's raw pool."""
    x = np.asarray(raw, dtype=np.float32)
    if pc.task == "embed":
        if dimensions is not None:
            x = x[..., :dimensions]
        if pc.normalize if normalize is None else normalize:
            x = l2_normalize(x)
        return x
    if pc.softmax:
        x = softmax(x)
    return x


def sigmoid(x):
    """1 / (1 + e^-x) in float64: a one-label cross-encoder's score (sentence-transformers' default)."""
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-12))


def class_probs(raw, pc: PoolerConfig) -> np.ndarray:
    """A classification head's probabilities, as vLLM's classify gives them: the pooler's softmax
    where --pooler-config asks for it, else sigmoid for one label and softmax for several."""
    x = postprocess(raw, pc)
    if pc.softmax:
        return x
    return sigmoid(x).astype(np.float32) if x.shape[-1] == 1 else softmax(x)
