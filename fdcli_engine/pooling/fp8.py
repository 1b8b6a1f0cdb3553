"""float32 to vLLM's fp8 embed_dtypes in numpy, bit for bit as torch casts on the CPU (vLLM encodes
with `tensor.to(torch.float8_e4m3fn / torch.float8_e5m2)`): round to nearest even; e4m3fn has no
infinity, so anything past its largest value (448), infinity included, is 448; e5m2 is IEEE-like, so
from 61440 up a number rounds to infinity. NaN stays NaN, with its sign, in both.

Each format is (mantissa bits, exponent bias); both use the same integer recipe on the float32 bits.
"""

from __future__ import annotations

import numpy as np

FP8_FORMATS = {"fp8_e4m3": (3, 7), "fp8_e5m2": (2, 15)}


def to_fp8(x: np.ndarray, embed_dtype: str) -> np.ndarray:
    """uint8 codes of the float32 array `x` in `embed_dtype` ("fp8_e4m3" is torch's e4m3fn)."""
    mant, bias = FP8_FORMATS[embed_dtype]
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    sign = ((bits >> np.uint32(24)) & np.uint32(0x80)).astype(np.uint8)
    mag = bits & np.uint32(0x7FFFFFFF)
    shift = np.uint32(23 - mant)

    # Normal results: rebias the exponent and round the dropped mantissa bits to nearest even.
    odd = (mag >> shift) & np.uint32(1)
    with np.errstate(over="ignore"):  # uint32 wrap-around of magnitudes below the rebias: not used
        normal = (mag - np.uint32((127 - bias) << 23) + np.uint32((1 << (22 - mant)) - 1) + odd) >> shift
    # Below the smallest normal: adding 2^k, whose float32 ulp is the smallest fp8 subnormal, lets the
    # float32 adder round; the added bits are then the subnormal's code.
    denorm = np.uint32((128 - bias + 23 - mant) << 23)
    small = mag < np.uint32((128 - bias) << 23)
    with np.errstate(over="ignore", invalid="ignore"):
        sub = (mag.view(np.float32) + denorm.view(np.float32)).view(np.uint32) - denorm
    code = np.where(small, sub, normal)

    nan = mag > np.uint32(0x7F800000)
    if mant == 3:  # e4m3fn: no infinity, code 0x7F is NaN; anything larger saturates to 448 (0x7E)
        code = np.where(nan, np.uint32(0x7F), np.minimum(code, np.uint32(0x7E)))
    else:  # e5m2: from 61440 up (inf too) rounds to inf (0x7C); NaN is 0x7F
        code = np.where(nan, np.uint32(0x7F), np.minimum(code, np.uint32(0x7C)))
    return code.astype(np.uint8) | sign
