// Calls fn from the ISA namespace that active_isa() selects. The AMX level (3) runs the AVX-512 code:
// only the quantized GEMM's prompt rows differ on it (kernels.cc). Every ISA-instantiated op dispatches
// through this, so a new level is added in one place.
#pragma once
#include "kernels.h"

#define FD_DISPATCH_IN(avx512, avx2, scalar, fn, ...) \
  switch (active_isa()) {                             \
    case 3:                                           \
    case 2:                                           \
      return avx512::fn(__VA_ARGS__);                 \
    case 1:                                           \
      return avx2::fn(__VA_ARGS__);                   \
    default:                                          \
      return scalar::fn(__VA_ARGS__);                 \
  }

#define FD_DISPATCH(fn, ...) FD_DISPATCH_IN(isa_avx512, isa_avx2, isa_scalar, fn, __VA_ARGS__)
