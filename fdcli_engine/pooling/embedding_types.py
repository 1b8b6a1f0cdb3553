"""Cohere's embedding types of a float embedding, as vLLM computes them (build_typed_embeddings):
float as it is; binary / ubinary one bit a value (1 where the value is >= 0), eight to a byte, first
value in the high bit, ubinary the byte 0..255 and binary the same minus 128; base64 the float32
little-endian bytes."""

from __future__ import annotations

import base64

import numpy as np

from fdcli_engine.pooling.encoding import to_bytes

EMBEDDING_TYPES = ("float", "binary", "ubinary", "base64")


def packed_bits(vec: np.ndarray, signed: bool) -> list[int]:
    """The sign bits of `vec` packed eight to a byte; ValueError unless its length is a multiple of 8."""
    flat = np.asarray(vec, dtype=np.float32).reshape(-1)
    if flat.size % 8:
        raise ValueError(f"binary embedding types need a dimension that is a multiple of 8, not {flat.size}")
    packed = np.packbits(flat >= 0).astype(np.int16)  # NaN compares False: a 0 bit, as vLLM's `>=`
    return (packed - 128 if signed else packed).tolist()


def typed_embeddings(vectors: list[np.ndarray], types: list[str]) -> dict[str, list]:
    """{type: one entry per vector} for each requested type."""
    out: dict[str, list] = {}
    for kind in types:
        if kind == "float":
            out[kind] = [np.asarray(v, dtype=np.float32).tolist() for v in vectors]
        elif kind in ("binary", "ubinary"):
            out[kind] = [packed_bits(v, signed=kind == "binary") for v in vectors]
        elif kind == "base64":
            out[kind] = [base64.b64encode(to_bytes(v, "float32", "little")).decode("ascii") for v in vectors]
        else:
            raise ValueError(f"embedding type {kind!r} is not one of {', '.join(EMBEDDING_TYPES)}")
    return out
