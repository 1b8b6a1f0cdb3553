"""A minimal safetensors reader that yields fp32 numpy arrays.

Own reader rather than `safetensors.numpy`: numpy has no bfloat16, and most checkpoints are bf16. The
format is an 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}},
then the raw little-endian data. Offsets are checked against the file size, so a truncated file is a
ModelLoadError naming the file instead of a garbage tensor.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from fdcli_engine.errors import ModelLoadError

_NUMPY_DTYPES = {
    "F32": np.float32,
    "F16": np.float16,
    "F64": np.float64,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}
_MAX_HEADER = 100 * 1024 * 1024


def read_safetensors_header(path: Path) -> tuple[dict, int]:
    """(header without __metadata__, offset of the data section)."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            raw_len = f.read(8)
            if len(raw_len) < 8:
                raise ValueError("file shorter than the 8-byte header length")
            (header_len,) = struct.unpack("<Q", raw_len)
            if header_len > min(size - 8, _MAX_HEADER):
                raise ValueError(f"header length {header_len} exceeds the file size {size}")
            header = json.loads(f.read(header_len))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: not a valid safetensors file ({exc})") from None
    if not isinstance(header, dict):
        raise ModelLoadError(f"{path}: not a valid safetensors file (header is not a JSON object)")
    header.pop("__metadata__", None)
    return header, 8 + header_len


def iter_safetensors(path: Path, keep=None) -> Iterator[tuple[str, np.ndarray]]:
    """Yield (name, fp32 array) for every floating-point tensor of one file, in header order; with
    `keep` (a predicate on names), only those it accepts (the others are not read)."""
    header, data_start = read_safetensors_header(path)
    if keep is not None:
        header = {name: info for name, info in header.items() if keep(name)}
    data_size = path.stat().st_size - data_start
    end_max = max((int(t["data_offsets"][1]) for t in header.values()), default=0)
    if end_max > data_size:
        raise ModelLoadError(
            f"{path}: truncated safetensors file (tensors need {end_max} bytes of data, file has {data_size})"
        )
    if end_max == 0:
        return
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=data_start, shape=(end_max,))
    for name, info in header.items():
        begin, end = (int(x) for x in info["data_offsets"])
        yield name, _to_fp32(data[begin:end], info["dtype"], tuple(info["shape"]), path, name)


def _to_fp32(raw: np.ndarray, dtype: str, shape: tuple, path: Path, name: str) -> np.ndarray:
    if dtype == "BF16":
        # bf16 is the top half of an fp32: widen the bits and shift them into place.
        bits = raw.view(np.uint16).astype(np.uint32) << 16
        arr = bits.view(np.float32)
    elif dtype in _NUMPY_DTYPES:
        arr = raw.view(_NUMPY_DTYPES[dtype]).astype(np.float32)  # astype copies out of the mmap
    else:
        raise ModelLoadError(f"{path}: tensor {name} has unsupported dtype {dtype}")
    try:
        return arr.reshape(shape)
    except ValueError:
        raise ModelLoadError(f"{path}: tensor {name} has {arr.size} values, shape {list(shape)}") from None
