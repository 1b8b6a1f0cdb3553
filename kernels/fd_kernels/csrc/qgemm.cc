// Instantiates qgemm_impl.h for AVX-512 VNNI, for AVX2 + FMA (qgemm_avx2.h) and, as portable C++, for the
// scalar baseline, and dispatches each call. An AVX-512 CPU without VNNI takes the AVX2 instantiation. The
// integer results are the same on every path; the VNNI and AVX2 paths also round the same fp32 steps in the
// same order (same bits), the scalar one without fma contraction.

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "decode_region.h"
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
  // Rows split over the threads for a prompt's ids: each row is scattered reads of the table.
#pragma omp parallel for schedule(static) if (t * k >= (1 << 16))
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

namespace region {

int64_t qgemm_items(const GemmArgs& g) {
  switch (qgemm_path()) {
    case 2:
      return isa_qvnni::qgemm_items(g);
    case 1:
      return isa_qavx2::qgemm_items(g);
    default:
      return isa_qscalar::qgemm_items(g);
  }
}

void qgemm_share(const GemmArgs& g, StealRanges& work) {
  switch (qgemm_path()) {
    case 2:
      return isa_qvnni::qgemm_share(g, work);
    case 1:
      return isa_qavx2::qgemm_share(g, work);
    default:
      return isa_qscalar::qgemm_share(g, work);
  }
}

Bytes qgemm_own_weights(const GemmArgs& g, int tid, int nth) {
  switch (qgemm_path()) {
    case 2:
      return isa_qvnni::qgemm_own_weights(g, tid, nth);
    case 1:
      return isa_qavx2::qgemm_own_weights(g, tid, nth);
    default:
      return isa_qscalar::qgemm_own_weights(g, tid, nth);
  }
}

}  // namespace region

// The roofline's "read once" (benchmarks/bench_decode_roofline.py): p[0, bytes) read by the OpenMP threads,
// each its own contiguous share, as the decode step's GEMMs split their weights; four independent OR chains
// of full-width loads, so the loop is bound by the loads alone. Returns the OR of the bytes' words: nonzero
// if and only if a byte is (which also keeps the reads from being optimized away).
__attribute__((target("avx512f"))) static uint64_t read_bytes_avx512(const uint8_t* p, int64_t lo, int64_t hi) {
  __m512i a[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
  int64_t i = lo;
  for (; i + 256 <= hi; i += 256)
    for (int j = 0; j < 4; ++j) a[j] = _mm512_or_si512(a[j], _mm512_loadu_si512(p + i + 64 * j));
  for (; i + 64 <= hi; i += 64) a[0] = _mm512_or_si512(a[0], _mm512_loadu_si512(p + i));
  const __m512i v = _mm512_or_si512(_mm512_or_si512(a[0], a[1]), _mm512_or_si512(a[2], a[3]));
  uint64_t r = (uint64_t)_mm512_reduce_or_epi64(v);
  for (; i < hi; ++i) r |= p[i];
  return r;
}

__attribute__((target("avx2"))) static uint64_t read_bytes_avx2(const uint8_t* p, int64_t lo, int64_t hi) {
  __m256i a[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
  int64_t i = lo;
  for (; i + 128 <= hi; i += 128)
    for (int j = 0; j < 4; ++j) a[j] = _mm256_or_si256(a[j], _mm256_loadu_si256((const __m256i*)(p + i + 32 * j)));
  const __m256i v = _mm256_or_si256(_mm256_or_si256(a[0], a[1]), _mm256_or_si256(a[2], a[3]));
  uint64_t out[4];
  _mm256_storeu_si256((__m256i*)out, v);
  uint64_t r = out[0] | out[1] | out[2] | out[3];
  for (; i < hi; ++i) r |= p[i];
  return r;
}

static uint64_t read_bytes_scalar(const uint8_t* p, int64_t lo, int64_t hi) {
  uint64_t r = 0;
  for (int64_t i = lo; i < hi; ++i) r |= p[i];
  return r;
}

}  // namespace fdk

extern "C" uint64_t fd_read_bytes(const uint8_t* p, int64_t bytes) {
  const int isa = fdk::active_isa();
  uint64_t r = 0;
#pragma omp parallel reduction(| : r)
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t lo = bytes / 256 * t / nt * 256, hi = t + 1 == nt ? bytes : bytes / 256 * (t + 1) / nt * 256;
    r |= isa >= 2   ? fdk::read_bytes_avx512(p, lo, hi)
         : isa == 1 ? fdk::read_bytes_avx2(p, lo, hi)
                    : fdk::read_bytes_scalar(p, lo, hi);
  }
  return r;
}

// Which instantiation qgemm() runs, for the tests (fd_kernels.native.qgemm_path, through ctypes).
extern "C" int32_t fd_qgemm_path() { return fdk::qgemm_path(); }
