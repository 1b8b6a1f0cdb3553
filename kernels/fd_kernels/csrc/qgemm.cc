// Instantiates qgemm_impl.h for AVX-512 VNNI and, as portable C++, for AVX2 and the scalar baseline, and
// dispatches each call. An AVX-512 CPU without VNNI takes the AVX2 instantiation: the integer results are
// the same on every path, only the speed differs.

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels.h"

namespace fdk {

constexpr int kQMaxRowsPortable = 4;

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
namespace isa_qvnni {
#define FD_QVNNI 1
#include "qgemm_impl.h"
#undef FD_QVNNI
}  // namespace isa_qvnni
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace isa_qavx2 {
#define FD_QVNNI 0
#include "qgemm_impl.h"
#undef FD_QVNNI
}  // namespace isa_qavx2
#pragma GCC pop_options

namespace isa_qscalar {
#define FD_QVNNI 0
#include "qgemm_impl.h"
#undef FD_QVNNI
}  // namespace isa_qscalar

void qgemm(const GemmArgs& g) {
  if (g.m == 0 || g.n == 0) return;
  static const bool vnni = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") != 0;
  }();
  const int isa = active_isa();
  if (isa >= 2 && vnni) return isa_qvnni::qgemm(g);
  if (isa >= 1) return isa_qavx2::qgemm(g);
  isa_qscalar::qgemm(g);
}

}  // namespace fdk
