// Instantiates encoder_impl.h per ISA (AVX-512, AVX2+FMA, scalar) with target pragmas and dispatches on
// fdk::active_isa(), exactly as kernels.cc does for kern_impl.h (so FD_KERNELS_ISA covers these too).

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "dispatch.h"
#include "encoder_kernels.h"
#include "kernels.h"

namespace fdk {

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,bmi2")
namespace enc_avx512 {
#define FD_W 16
#include "encoder_impl.h"
#undef FD_W
}  // namespace enc_avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace enc_avx2 {
#define FD_W 8
#include "encoder_impl.h"
#undef FD_W
}  // namespace enc_avx2
#pragma GCC pop_options

namespace enc_scalar {
#define FD_W 1
#include "encoder_impl.h"
#undef FD_W
}  // namespace enc_scalar

#define FD_ENC_DISPATCH(fn, ...) FD_DISPATCH_IN(enc_avx512, enc_avx2, enc_scalar, fn, __VA_ARGS__)

void varlen_attention(const VarlenAttnArgs& a) { FD_ENC_DISPATCH(varlen_attention, a); }

void gelu(const float* x, int64_t n, float* out) { FD_ENC_DISPATCH(gelu, x, n, out); }

void add_layer_norm(const float* x, const float* res, const float* w, const float* b, float eps, int64_t t,
                    int64_t h, float* out) {
  FD_ENC_DISPATCH(add_layer_norm, x, res, w, b, eps, t, h, out);
}

}  // namespace fdk
