"""How a pooled array travels in a response: nested floats, base64 of its bytes in vLLM's
`embed_dtype` and `endianness` (OpenAI's base64 is float32 little-endian, vLLM's defaults on x86), or
vLLM's `bytes` form: one binary body of every array's bytes, described by a `metadata` header."""

from __future__ import annotations

import base64
import json
import sys
from dataclasses import dataclass

import numpy as np

from fdcli_engine.pooling.fp8 import FP8_FORMATS, to_fp8

BYTES_FORMATS = ("bytes", "bytes_only")  # vLLM's binary bodies: with the metadata header, or without

# vLLM's EmbedDType values (fp8_e4m3 is torch's float8_e4m3fn, as in vLLM).
EMBED_DTYPES = ("float32", "float16", "bfloat16", *FP8_FORMATS)


def to_bytes(vec: np.ndarray, embed_dtype: str = "float32", endianness: str = "native") -> bytes:
    """The array flattened, cast to `embed_dtype` (round to nearest even, as torch casts) and laid out
    in `endianness` ("native": this machine's, as vLLM)."""
    x = np.ascontiguousarray(vec, dtype=np.float32).reshape(-1)
    if embed_dtype == "float16":
        with np.errstate(over="ignore"):  # beyond float16's range is inf, as torch casts
            out = x.astype(np.float16)
    elif embed_dtype == "bfloat16":
        bits = x.view(np.uint32)
        rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
        out = np.where(np.isnan(x), np.uint32(0x7FC00000), rounded) >> np.uint32(16)
        out = out.astype(np.uint16)
    elif embed_dtype == "float32":
        out = x
    elif embed_dtype in FP8_FORMATS:
        out = to_fp8(x, embed_dtype)  # one byte a value: no byte order
    else:
        raise ValueError(f"embed_dtype {embed_dtype!r} is not one of {EMBED_DTYPES}")
    order = sys.byteorder if endianness == "native" else endianness
    return out.astype(out.dtype.newbyteorder("<" if order == "little" else ">")).tobytes()


def encode_vector(
    vec: np.ndarray, encoding_format: str, embed_dtype: str = "float32", endianness: str = "native"
):
    """A pooled array as the response carries it: nested floats (float32 values, whatever the
    embed_dtype, as vLLM), or base64 of `to_bytes`."""
    if encoding_format == "base64":
        return base64.b64encode(to_bytes(vec, embed_dtype, endianness)).decode("ascii")
    return vec.tolist()


@dataclass(frozen=True)
class PoolingBytes:
    """vLLM's binary pooling response (serial_utils.encode_pooling_bytes): `content` is each array's
    bytes in request order; `metadata` (the `metadata` header's JSON; None for bytes_only) has the
    id, created, model, usage and one item per array: index, embed_dtype, endianness, start, end,
    shape."""

    content: bytes
    metadata: str | None

    media_type = "application/octet-stream"


def pooling_bytes(
    arrays, encoding_format: str, embed_dtype: str, endianness: str, head: dict
) -> PoolingBytes:
    """`head`: the response's id, created, model and usage, as the JSON response has them."""
    chunks, items, offset = [], [], 0
    for i, a in enumerate(arrays):
        raw = to_bytes(a, embed_dtype, endianness)
        items.append(
            {
                "index": i,
                "embed_dtype": embed_dtype,
                "endianness": endianness,
                "start": offset,
                "end": offset + len(raw),
                "shape": list(np.shape(a)),
            }
        )
        chunks.append(raw)
        offset += len(raw)
    meta = None if encoding_format == "bytes_only" else json.dumps({**head, "data": items})
    return PoolingBytes(b"".join(chunks), meta)
