// A/B timing of the decode region's GGUF GEMMs: two copies of qgemm_impl.h (FD_A_QIMPL: a saved tree,
// FD_B_QIMPL: this one) in separate namespaces at the VNNI level (with -DFD_AB_AVX2, the AVX2 level:
// qgemm_avx2.h, and any header it includes, is taken from each tree's directory first), alternated pass by
// pass on the same weights. Build (from the repo root):
//   g++ -O3 -std=c++17 -march=x86-64-v2 -fopenmp -Ikernels/fd_kernels/csrc \
//       -DFD_A_QIMPL='"/tmp/old/qgemm_impl.h"' -DFD_B_QIMPL='"qgemm_impl.h"' kernels/bench_qgemm_ab.cc \
//       -o /tmp/bench_qgemm_ab
// Run: bench_qgemm_ab ROWS LAYERS PASSES THREADS [HEAD], or bench_qgemm_ab gemm M K N KIND PASSES THREADS:
// one whole qgemm call (KIND 3 Q4_0, 4 Q4_1, 5 Q8_0), as a prompt's linear makes it, printing GMAC/s per
// pass and whether A's and B's outputs are the same bits. Each timed step of the first form runs, for each
// of LAYERS distinct Q4_1 layers (SmolLM2-135M's shapes: qkv 576->960, o 576->576, gate_up 576->3072, down
// 1536->576), the four GEMMs as the decode region does: every thread quantizes the rows itself and takes
// items (qgemm_share) between barriers; with HEAD 1, then the tied Q8_0 LM head (576->49152) the same way.
// LAYERS 30 streams a step's weights; LAYERS 1 keeps one layer's in cache. Prints TSC kcycles per step per
// GEMM kind and in all, and whether A's and B's outputs are the same bits.
#include <immintrin.h>
#include <omp.h>
#include <x86intrin.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "decode_region.h"
#include "kernels.h"
#include "ranges.h"

namespace fdk {
constexpr int kQMaxRowsPortable = 4;
#pragma GCC push_options
#if FD_AB_AVX2
#pragma GCC target("avx2,fma,f16c")
#define FD_QVNNI 0
#define FD_QAVX2 1
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#define FD_QVNNI 1
#define FD_QAVX2 0
#endif
namespace qa {
#include FD_A_QIMPL
}  // namespace qa
namespace qb {
#include FD_B_QIMPL
}  // namespace qb
#undef FD_QAVX2
#undef FD_QVNNI
#pragma GCC pop_options
}  // namespace fdk

using namespace fdk;

// Random codes, fp16 scales and mins of 2^-7 .. 2^-6 (mins of either sign), all finite.
static void random_records(std::vector<uint8_t>& v, int kind, std::mt19937& rng) {
  const int64_t rec = q_record_bytes(kind);
  for (size_t i = 0; i < v.size(); i += 4) {
    const uint32_t r = rng();
    std::memcpy(&v[i], &r, std::min<size_t>(4, v.size() - i));
  }
  for (size_t i = 0; i < v.size(); i += rec)
    for (int c = 0; c < q_codes_offset(kind) / 2; ++c) {
      const uint16_t h = (uint16_t)(0x2000 | (rng() & 0x03FF) | (c >= kQNR && (rng() & 1) ? 0x8000 : 0));
      std::memcpy(&v[i + 2 * c], &h, 2);
    }
}

static int gemm_ab(int64_t m, int64_t k, int64_t n, int kind, int64_t passes) {
  std::mt19937 rng(7);
  std::vector<uint8_t> w((n + kQNR - 1) / kQNR * (k / kQBlock) * q_record_bytes(kind));
  random_records(w, kind, rng);
  std::vector<float> a(m * k), bias(n), ca(m * n), cb(m * n);
  std::normal_distribution<float> nd;
  for (auto& x : a) x = nd(rng);
  for (auto& x : bias) x = nd(rng);
  GemmArgs g{};
  g.a = a.data();
  g.lda = k;
  g.m = m;
  g.k = k;
  g.n = n;
  g.w = w.data();
  g.kind = kind;
  g.bias = bias.data();
  double best[2] = {1e30, 1e30};
  for (int64_t pass = 0; pass < passes; ++pass)
    for (int ab = 0; ab < 2; ++ab) {
      g.c = ab ? cb.data() : ca.data();
      const double t0 = omp_get_wtime();
      if (ab)
        qb::qgemm(g);
      else
        qa::qgemm(g);
      const double t = omp_get_wtime() - t0;
      best[ab] = std::min(best[ab], t);
      if (ab)
        std::printf("pass %ld: A %.2f B %.2f GMAC/s\n", (long)pass, m * n * k / best[0] / 1e9, m * n * k / t / 1e9);
    }
  const bool same = std::memcmp(ca.data(), cb.data(), m * n * sizeof(float)) == 0;
  std::printf("%ld x %ld x %ld kind %d: best A %.3f ms B %.3f ms (B/A %.3f), outputs %s\n", (long)m, (long)k,
              (long)n, kind, best[0] * 1e3, best[1] * 1e3, best[1] / best[0], same ? "bit-equal" : "DIFFER");
  return same ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc == 8 && std::strcmp(argv[1], "gemm") == 0) {
    omp_set_num_threads(std::atoi(argv[7]));
    return gemm_ab(std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]),
                   std::atoi(argv[6]));
  }
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s ROWS LAYERS PASSES THREADS [HEAD]\n", argv[0]);
    return 2;
  }
  const int64_t m = std::atoi(argv[1]), layers = std::atoi(argv[2]), passes = std::atoi(argv[3]);
  const int threads = std::atoi(argv[4]);
  const bool head = argc > 5 && std::atoi(argv[5]) != 0;
  omp_set_num_threads(threads);
  const int64_t shapes[5][2] = {{576, 960}, {576, 576}, {576, 3072}, {1536, 576}, {576, 49152}};
  const int kinds[5] = {kQ4_1, kQ4_1, kQ4_1, kQ4_1, kQ8_0};
  std::mt19937 rng(7);
  std::vector<std::vector<uint8_t>> w(4 * layers + 1);
  auto fill = [&](std::vector<uint8_t>& v, int s) {
    const int64_t k = shapes[s][0], n = shapes[s][1], nb = k / kQBlock, rec = q_record_bytes(kinds[s]);
    v.resize((n + kQNR - 1) / kQNR * nb * rec);
    random_records(v, kinds[s], rng);
  };
  for (int64_t l = 0; l < layers; ++l)
    for (int s = 0; s < 4; ++s) fill(w[4 * l + s], s);
  if (head) fill(w[4 * layers], 4);
  std::vector<float> a(m * 1536), ca(m * 49152), cb(m * 49152);
  std::normal_distribution<float> nd;
  for (auto& x : a) x = nd(rng);
  StealRanges work(1);
  auto args = [&](int64_t l, int s, float* c) {
    GemmArgs g{};
    g.a = a.data();
    g.lda = shapes[s][0];
    g.m = m;
    g.k = shapes[s][0];
    g.n = shapes[s][1];
    g.w = w[s == 4 ? 4 * layers : 4 * l + s].data();
    g.kind = kinds[s];
    g.c = c;
    return g;
  };
  double best[2][6];
  std::fill(&best[0][0], &best[0][0] + 12, 1e30);
  bool same = true;
  for (int64_t pass = 0; pass < passes; ++pass)
    for (int ab = 0; ab < 2; ++ab) {
      uint64_t t[6] = {0, 0, 0, 0, 0, 0};
#pragma omp parallel
      for (int64_t l = 0; l < layers + (head ? 1 : 0); ++l)
        for (int s = l < layers ? 0 : 4; s < (l < layers ? 4 : 5); ++s) {
          const GemmArgs g = args(l, s, ab ? cb.data() : ca.data());
#pragma omp single
          work.reset(ab ? qb::qgemm_items(g) : qa::qgemm_items(g));
          const uint64_t t0 = __rdtsc();
          if (ab)
            qb::qgemm_share(g, work);
          else
            qa::qgemm_share(g, work);
#pragma omp barrier
          if (omp_get_thread_num() == 0) t[s] += __rdtsc() - t0;
        }
      t[5] = t[0] + t[1] + t[2] + t[3] + t[4];
      for (int i = 0; i < 6; ++i) best[ab][i] = std::min(best[ab][i], (double)t[i]);
      if (ab) {
        same = same && std::memcmp(ca.data(), cb.data(), m * (head ? 49152 : 576) * sizeof(float)) == 0;
        std::printf("pass %ld: A %.0f B %.0f kcycles a step (B/A %.3f)\n", (long)pass, best[0][5] / 1e3, t[5] / 1e3,
                    (double)t[5] / best[0][5]);
      }
    }
  const char* names[6] = {"qkv", "o_proj", "gate_up", "down", "head", "all"};
  for (int i = 0; i < 6; ++i) {
    if (i == 4 && !head) continue;
    std::printf("%-8s min A %8.0f B %8.0f kcycles (B/A %.3f)\n", names[i], best[0][i] / 1e3, best[1][i] / 1e3,
                best[1][i] / best[0][i]);
  }
  std::printf("outputs (last GEMM) %s\n", same ? "bit-equal" : "DIFFER");
  return same ? 0 : 1;
}
