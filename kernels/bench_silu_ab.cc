// In-process A/B of vexp.h's vsilu_mul from two trees, AVX-512 and AVX2 widths: its error against
// float64 (relative, by range of a; special values) and its time over 512 rows of 1536 (gate, up) pairs
// kept in cache (the compute cost of silu(gate) * up, as amx.cc's convert_row pays it per row block).
// Build (A = before, B = after; each a csrc directory):
//   g++ -O3 -std=c++17 -march=x86-64-v2 -fno-math-errno -DCSRC_A=/work/wt/base/kernels/fd_kernels/csrc \
//       -DCSRC_B=$PWD/kernels/fd_kernels/csrc kernels/bench_silu_ab.cc -o /tmp/silu_ab && /tmp/silu_ab 3
// Timings under `flock /work/wt/bench.lock` on a shared machine; the error figures are exact.
#include <immintrin.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#define FD_STR2(x) #x
#define FD_STR(x) FD_STR2(x)
#define FD_HDR(dir, name) FD_STR(dir/name)

#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,bmi2")
#define FD_W 16
namespace a16 {
#include FD_HDR(CSRC_A, simd.h)
#include FD_HDR(CSRC_A, vexp.h)
}  // namespace a16
namespace b16 {
#include FD_HDR(CSRC_B, simd.h)
#include FD_HDR(CSRC_B, vexp.h)
}  // namespace b16
#undef FD_W
#pragma GCC target("avx2,fma,f16c")
#define FD_W 8
namespace a8 {
#include FD_HDR(CSRC_A, simd.h)
#include FD_HDR(CSRC_A, vexp.h)
}  // namespace a8
namespace b8 {
#include FD_HDR(CSRC_B, simd.h)
#include FD_HDR(CSRC_B, vexp.h)
}  // namespace b8
#undef FD_W
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,bmi2")

typedef void (*Rows)(const float*, const float*, float*, int64_t);
template <class V, V (*f)(V, V), int W>
static void rows(const float* g, const float* u, float* o, int64_t n) {
  for (int64_t i = 0; i < n; i += W) {
    if constexpr (W == 16) _mm512_storeu_ps(o + i, f(_mm512_loadu_ps(g + i), _mm512_loadu_ps(u + i)));
    else _mm256_storeu_ps(o + i, f(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
  }
}

static void errors(const char* name, Rows f) {
  std::vector<float> s;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> wide(-100.f, 100.f), narrow(-20.f, 20.f);
  for (int i = 0; i < 4000000; ++i) s.push_back(wide(rng));
  for (int i = 0; i < 8000000; ++i) s.push_back(narrow(rng));
  for (float x = 1e-30f; x < 100.f; x *= 1.00001f) s.insert(s.end(), {x, -x});
  const float sp[16] = {-0.0f, 0.0f, 1e-30f, -1e-30f, -87.0f, -88.0f, -104.f, -1e4f,
                        1e4f,  3e38f, -3e38f, INFINITY, -INFINITY, NAN, 1.0f, -1.0f};
  while (s.size() % 16) s.push_back(1.0f);
  const size_t body = s.size();
  s.insert(s.end(), sp, sp + 16);
  std::vector<float> one(s.size(), 1.0f), o(s.size());
  f(s.data(), one.data(), o.data(), s.size());
  double rel[3] = {0, 0, 0}, at[3] = {0, 0, 0}, ratio = 0;
  for (size_t i = 0; i < body; ++i) {
    const double x = s[i], w = x / (1.0 + std::exp(-x)), r = std::fabs(o[i] - w) / std::fabs(w);
    const int b = x < -87 ? 0 : x < 0 ? 1 : 2;
    if (w != 0 && r > rel[b]) rel[b] = r, at[b] = x;
    if (x >= -87) ratio = std::fmax(ratio, r / (5e-7 + 7.3e-8 * std::fabs(x) * (x < 0)));
  }
  printf("%s: max rel err a < -87: %.3g (a=%g), -87 <= a < 0: %.3g (a=%g), a >= 0: %.3g (a=%g); "
         "max err / (5e-7 + 7.3e-8 |a| [a < 0]) = %.3f\n  specials (up = 1):",
         name, rel[0], at[0], rel[1], at[1], rel[2], at[2], ratio);
  for (size_t i = body; i < s.size(); ++i) printf(" %g->%g", s[i], o[i]);
  printf("\n");
}

int main(int argc, char** argv) {
  const Rows fs[4] = {rows<__m512, a16::vsilu_mul, 16>, rows<__m512, b16::vsilu_mul, 16>,
                      rows<__m256, a8::vsilu_mul, 8>, rows<__m256, b8::vsilu_mul, 8>};
  const char* names[4] = {"avx512 A", "avx512 B", "avx2 A", "avx2 B"};
  for (int k = 0; k < 4; ++k) errors(names[k], fs[k]);
  const int64_t n = 1536, hot = 32;  // 32 rows of [gate | up] stay in L2
  std::vector<float> gu(hot * 2 * n), out(hot * n);
  std::mt19937 rng(0);
  std::normal_distribution<float> nd(0, 2);
  for (auto& x : gu) x = nd(rng);
  for (int pass = 0; pass < (argc > 1 ? atoi(argv[1]) : 3); ++pass) {
    printf("pass %d, us per 512 rows of 1536 (best of 20):", pass);
    for (int k = 0; k < 4; ++k) {
      double best = 1e9;
      for (int rep = 0; rep < 20; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int64_t r = 0; r < 512; ++r)
          fs[k](&gu[r % hot * 2 * n], &gu[r % hot * 2 * n + n], &out[r % hot * n], n);
        best = std::fmin(best, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      }
      printf("  %s %.0f", names[k], best);
    }
    printf("\n");
  }
}
