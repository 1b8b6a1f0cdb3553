// Calls fn from the ISA namespace that active_isa() selects. The bf16 levels (kIsaAvx512Bf16, kIsaAmx) run
// the AVX-512 code: only the quantized GEMM's prompt rows (kernels.cc) and, on AMX, prompt attention differ.
// Every ISA-instantiated op dispatches through this, so a new level is added in one place.
#pragma once
#include "kernels.h"

#define FD_DISPATCH_IN(avx512, avx2, scalar, fn, ...) \
  switch (active_isa()) {                             \
    case kIsaAmx:                                     \
    case kIsaAvx512Bf16:                              \
    case kIsaAvx512:                                  \
      return avx512::fn(__VA_ARGS__);                 \
    case kIsaAvx2:                                    \
      return avx2::fn(__VA_ARGS__);                   \
    default:                                          \
      return scalar::fn(__VA_ARGS__);                 \
  }

#define FD_DISPATCH(fn, ...) FD_DISPATCH_IN(isa_avx512, isa_avx2, isa_scalar, fn, __VA_ARGS__)
