"""The C8 row rule for KV offload's int8 tier (csrc/c8_impl.h through csrc/kv_s8_ops.cc), on numpy arrays
through ctypes like the sampler (native/sampler.py): one pass each way, writing into the caller's arrays.
Values are fp32, or a bf16 pool's bits (uint16): widened exactly before the rule, and a restore rounds to
bf16 as the bf16 cache does. Oracle: fd_kernels.reference.quantize_kv_s8 (codes and scales bit for bit)
and codes * scales in fp32 (then reference.round_bf16 for bf16)."""

from __future__ import annotations

import ctypes

import numpy as np

from fd_kernels.build import library_path as _library_path

_fns = None  # {(name, values dtype): ctypes function}, bound on first use


def _bind():
    global _fns
    if _fns is None:
        lib = ctypes.CDLL(_library_path())
        ptr, i64 = ctypes.c_void_p, ctypes.c_int64
        _fns = {}
        for dtype, suffix in ((np.dtype(np.float32), ""), (np.dtype(np.uint16), "_bf16")):
            q, d = (
                getattr(lib, f"fd_kv_s8_quantize{suffix}_host"),
                getattr(lib, f"fd_kv_s8_dequantize{suffix}_host"),
            )
            q.argtypes, d.argtypes = [ptr, i64, i64, ptr, ptr], [ptr, ptr, i64, i64, ptr]
            q.restype = d.restype = None
            _fns["quantize", dtype], _fns["dequantize", dtype] = q, d
    return _fns


def _check(a: np.ndarray, dtypes, shape: tuple, name: str) -> None:
    if a.dtype not in dtypes or a.shape != shape or not a.flags.c_contiguous:
        want = " or ".join(str(np.dtype(d)) for d in dtypes)
        raise ValueError(f"kv_s8: {name} must be a contiguous {want} array of shape {shape}")
    if name.startswith("out") and not a.flags.writeable:
        raise ValueError(f"kv_s8: {name} is read-only")


_VALUES = (np.float32, np.uint16)


def kv_s8_quantize(x: np.ndarray, codes: np.ndarray, scales: np.ndarray) -> None:
    """Rows x[..., hd] (fp32, or bf16 bits) into int8 codes (x's shape) and fp32 scales x.shape[:-1]."""
    _check(x, _VALUES, x.shape, "x")
    _check(codes, (np.int8,), x.shape, "out codes")
    _check(scales, (np.float32,), x.shape[:-1], "out scales")
    hd = x.shape[-1]
    fn = _bind()["quantize", x.dtype]
    fn(x.ctypes.data, x.size // hd if hd else 0, hd, codes.ctypes.data, scales.ctypes.data)


def kv_s8_dequantize(codes: np.ndarray, scales: np.ndarray, out: np.ndarray) -> None:
    """codes[..., hd] * scales[..., None] in fp32 into `out` (codes' shape; fp32, or bf16 bits rounded
    to nearest even)."""
    _check(codes, (np.int8,), codes.shape, "codes")
    _check(scales, (np.float32,), codes.shape[:-1], "scales")
    _check(out, _VALUES, codes.shape, "out")
    hd = codes.shape[-1]
    fn = _bind()["dequantize", out.dtype]
    fn(codes.ctypes.data, scales.ctypes.data, codes.size // hd if hd else 0, hd, out.ctypes.data)
