"""The fused sampler's binding (csrc/sampler_impl.h through csrc/sampler_ops.cc's fd_sample_host): numpy
in and out, called through ctypes rather than as a Paddle op (sampler_ops.cc says why). Layout in
fd_kernels.sampler_layout, semantics in fd_kernels.reference.sampler."""

from __future__ import annotations

import ctypes

import numpy as np

from fd_kernels.build import library_path as _library_path
from fd_kernels.sampler_layout import META_COLUMNS, PARAM_COLUMNS

_sample_host = None  # the library's fd_sample_host through ctypes, bound on first use
_SAMPLE_PARAMS, _SAMPLE_META = len(PARAM_COLUMNS), len(META_COLUMNS)  # csrc/sampler.h mirrors them


def _bind_sample_host():
    global _sample_host
    if _sample_host is None:
        fn = ctypes.CDLL(_library_path()).fd_sample_host
        ptr, i64 = ctypes.c_void_p, ctypes.c_int64
        fn.argtypes = [ptr, i64, i64, ptr, ptr, i64, ptr, ptr, i64, ctypes.c_int32, ptr]
        fn.restype = i64
        _sample_host = fn
    return _sample_host


def _host_array(a, dtype, ndim: int, name: str) -> np.ndarray:
    a = np.ascontiguousarray(a, dtype=dtype)
    if a.ndim != ndim:
        raise ValueError(f"sample: {name} must be a {ndim}-D array, got shape {a.shape}")
    return a


def sample(logits, params, ids, meta, uniforms, rejection: bool = False) -> np.ndarray:
    """The fused sampler (csrc/sampler_impl.h) on numpy inputs; layout in fd_kernels.sampler_layout,
    semantics in fd_kernels.reference.sampler. Returns int64 [B]. Called through ctypes, not as a Paddle op
    (csrc/sampler_ops.cc says why)."""
    host = _bind_sample_host()
    logits = _host_array(logits, np.float32, 2, "logits")
    params = _host_array(params, np.float64, 2, "params")
    ids = _host_array(ids, np.int64, 1, "ids")
    meta = _host_array(meta, np.int64, 2, "meta")
    uniforms = _host_array(uniforms, np.float64, 2, "uniforms")
    rows, vocab = logits.shape
    if vocab == 0:
        raise ValueError("sample: empty vocabulary")
    if params.shape != (rows, _SAMPLE_PARAMS):
        raise ValueError(f"sample: params must be [rows, {_SAMPLE_PARAMS}], got {params.shape}")
    if meta.shape != (rows, _SAMPLE_META):
        raise ValueError(f"sample: meta must be [rows, {_SAMPLE_META}], got {meta.shape}")
    if uniforms.shape[0] != rows or uniforms.shape[1] < 1:
        raise ValueError(f"sample: uniforms must be [rows, >= 1], got {uniforms.shape}")
    out = np.empty(rows, dtype=np.int64)
    bad = host(
        logits.ctypes.data,
        rows,
        vocab,
        params.ctypes.data,
        ids.ctypes.data,
        ids.size,
        meta.ctypes.data,
        uniforms.ctypes.data,
        uniforms.shape[1],
        int(bool(rejection)),
        out.ctypes.data,
    )
    if bad >= 0:
        raise ValueError(f"sample: row {bad} has ids outside the ids tensor")
    return out
