// Instantiates qgemm_impl.h for AVX-512 VNNI, for AVX2 + FMA (qgemm_avx2.h) and, as portable C++, for the
// scalar baseline, and dispatches each call. An AVX-512 CPU without VNNI takes the AVX2 instantiation. The
// integer results are the same on every path; the VNNI and AVX2 paths also round the same fp32 steps in the
// same order (same bits), the scalar one without fma contraction.

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels.h"
#include "ranges.h"

namespace fdk {

constexpr int kQMaxRowsPortable = 4;

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
namespace isa_qvnni {
#define FD_QVNNI 1
#define FD_QAVX2 0
#include "qgemm_impl.h"
#undef FD_QAVX2
#undef FD_QVNNI
}  // namespace isa_qvnni
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace isa_qavx2 {
#define FD_QVNNI 0
#define FD_QAVX2 1
#include "qgemm_impl.h"
#undef FD_QAVX2
#undef FD_QVNNI
}  // namespace isa_qavx2
#pragma GCC pop_options

namespace isa_qscalar {
#define FD_QVNNI 0
#define FD_QAVX2 0
#include "qgemm_impl.h"
#undef FD_QAVX2
#undef FD_QVNNI
}  // namespace isa_qscalar

void q_rows(const void* w, int kind, int64_t k, const int64_t* ids, int64_t t, float* out) {
  const int64_t nb = k / kQBlock, rec = q_record_bytes(kind), codes = q_codes_offset(kind);
  const int32_t z = q_zero(kind);
  for (int64_t i = 0; i < t; ++i) {
    const int64_t v = ids[i], p = v / kQNR, c = v % kQNR;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* r = (const uint8_t*)w + (p * nb + b) * rec;
      uint16_t h;
      std::memcpy(&h, r + 2 * c, 2);
      const float d = isa_qscalar::half_to_float(h);
      float m = 0.0f;
      if (kind == kQ4_1) {
        std::memcpy(&h, r + 2 * kQNR + 2 * c, 2);
        m = isa_qscalar::half_to_float(h);
      }
      float* o = out + i * k + b * kQBlock;
      for (int j = 0; j < kQBlock; ++j) {
        const int32_t u = isa_qscalar::q_code(r + codes, kind != kQ8_0, (int)c, j);
        // d * u is exact in fp32 (an fp16 times at most 8 bits), so one rounding, as gguf's d * q + m.
        o[j] = kind == kQ4_1 ? d * (float)u + m : d * (float)(u - z);
      }
    }
  }
}

// 2: VNNI, 1: AVX2, 0: scalar, decided once per process from the CPU and active_isa().
static int qgemm_path() {
  static const int path = [] {
    __builtin_cpu_init();
    const int isa = active_isa();
    if (isa >= 2 && __builtin_cpu_supports("avx512vnni")) return 2;
    return isa >= 1 ? 1 : 0;
  }();
  return path;
}

void qgemm(const GemmArgs& g) {
  if (g.m == 0 || g.n == 0) return;
  switch (qgemm_path()) {
    case 2:
      return isa_qvnni::qgemm(g);
    case 1:
      return isa_qavx2::qgemm(g);
    default:
      return isa_qscalar::qgemm(g);
  }
}

}  // namespace fdk

// Which instantiation qgemm() runs, for the tests (fd_kernels.native.qgemm_path, through ctypes).
extern "C" int32_t fd_qgemm_path() { return fdk::qgemm_path(); }
