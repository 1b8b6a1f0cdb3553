"""The C8 row rule for KV offload's int8 tier (csrc/c8_impl.h through csrc/kv_s8_ops.cc), on numpy arrays
through ctypes like the sampler (native/sampler.py): one pass each way, writing into the caller's arrays.
Oracle: fd_kernels.reference.quantize_kv_s8 (codes and scales bit for bit) and codes * scales in fp32."""

from __future__ import annotations

import ctypes

import numpy as np

from fd_kernels.build import library_path as _library_path

_fns = None  # (quantize, dequantize) through ctypes, bound on first use


def _bind():
    global _fns
    if _fns is None:
        lib = ctypes.CDLL(_library_path())
        ptr, i64 = ctypes.c_void_p, ctypes.c_int64
        q, d = lib.fd_kv_s8_quantize_host, lib.fd_kv_s8_dequantize_host
        for fn in (q, d):
            fn.argtypes = [ptr, i64, i64, ptr, ptr] if fn is q else [ptr, ptr, i64, i64, ptr]
            fn.restype = None
        _fns = (q, d)
    return _fns


def _check(a: np.ndarray, dtype, shape: tuple, name: str) -> None:
    if a.dtype != dtype or a.shape != shape or not a.flags.c_contiguous:
        raise ValueError(f"kv_s8: {name} must be a contiguous {np.dtype(dtype)} array of shape {shape}")
    if name.startswith("out") and not a.flags.writeable:
        raise ValueError(f"kv_s8: {name} is read-only")


def kv_s8_quantize(x: np.ndarray, codes: np.ndarray, scales: np.ndarray) -> None:
    """Rows x[..., hd] (fp32) into int8 codes (x's shape) and fp32 scales x.shape[:-1], in place."""
    _check(x, np.float32, x.shape, "x")
    _check(codes, np.int8, x.shape, "out codes")
    _check(scales, np.float32, x.shape[:-1], "out scales")
    hd = x.shape[-1]
    _bind()[0](x.ctypes.data, x.size // hd if hd else 0, hd, codes.ctypes.data, scales.ctypes.data)


def kv_s8_dequantize(codes: np.ndarray, scales: np.ndarray, out: np.ndarray) -> None:
    """codes[..., hd] * scales[..., None] in fp32, written into `out` (codes' shape), in place."""
    _check(codes, np.int8, codes.shape, "codes")
    _check(scales, np.float32, codes.shape[:-1], "scales")
    _check(out, np.float32, codes.shape, "out")
    hd = codes.shape[-1]
    _bind()[1](codes.ctypes.data, scales.ctypes.data, codes.size // hd if hd else 0, hd, out.ctypes.data)
