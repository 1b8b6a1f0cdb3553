// Instantiates sampler_impl.h per ISA (as kernels.cc does for kern_impl.h) and dispatches with the same
// choice, fdk::active_isa().

#include <immintrin.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "dispatch.h"
#include "kernels.h"
#include "sampler.h"

namespace fdk {

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,bmi2")
namespace isa_avx512 {
#define FD_W 16
#include "sampler_impl.h"
#undef FD_W
}  // namespace isa_avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace isa_avx2 {
#define FD_W 8
#include "sampler_impl.h"
#undef FD_W
}  // namespace isa_avx2
#pragma GCC pop_options

namespace isa_scalar {
#define FD_W 1
#include "sampler_impl.h"
#undef FD_W
}  // namespace isa_scalar

void sample(const SampleArgs& a) { FD_DISPATCH(sample, a); }

}  // namespace fdk
