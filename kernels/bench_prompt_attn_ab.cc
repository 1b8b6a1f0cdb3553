// A/B timing of prompt (prefill) attention: two copies of kern_impl.h (FD_A_IMPL: a saved tree, FD_B_IMPL:
// this one) in separate namespaces, alternated pass by pass on the same cache. One sequence of CTX prompt
// tokens, every row marked in prompt_rows, block 16, bf16 cache; by default SmolLM2's 9 / 3 heads, hd 64.
// Build (from the repo root):
//   g++ -O3 -std=c++17 -march=x86-64-v2 -fopenmp -Ikernels/fd_kernels/csrc \
//       -DFD_A_IMPL='"/tmp/old/kern_impl.h"' -DFD_B_IMPL='"kern_impl.h"' kernels/bench_prompt_attn_ab.cc \
//       kernels/fd_kernels/csrc/{kernels,qgemm,amx}.cc -o /tmp/bench_prompt_attn_ab
// Run: bench_prompt_attn_ab CTX LAYERS PASSES THREADS [HD NH NKV] (default 64 9 3). Prints per-layer
// milliseconds (TSC at 2.1 GHz). Environment ISA=8: the AVX2 (w8) kernels instead of AVX-512 (w16).
#include <immintrin.h>
#include <omp.h>
#include <x86intrin.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "amx_tiles.h"
#include "dispatch.h"
#include "kernels.h"
#include "ranges.h"
#include "scratch.h"

#include "bench_ab_trees.h"

int main(int argc, char** argv) {
  const int64_t ctx = argc > 1 ? std::atol(argv[1]) : 512;
  const int layers = argc > 2 ? std::atoi(argv[2]) : 4, passes = argc > 3 ? std::atoi(argv[3]) : 10;
  const int threads = argc > 4 ? std::atoi(argv[4]) : 2;
  omp_set_num_threads(threads);
  const int64_t hd = argc > 5 ? std::atol(argv[5]) : 64, nh = argc > 6 ? std::atol(argv[6]) : 9;
  const int64_t nkv = argc > 7 ? std::atol(argv[7]) : 3, bs = 16, mb = (ctx + bs - 1) / bs;
  const bool w8 = std::getenv("ISA") && std::atoi(std::getenv("ISA")) == 8;
  std::mt19937 rng(0);
  std::normal_distribution<float> dist;
  std::vector<int64_t> qsl{0, ctx}, lens{ctx}, bt(mb);
  for (int64_t i = 0; i < mb; ++i) bt[i] = i;
  std::vector<uint8_t> marks(ctx, 1);
  std::vector<float> q(ctx * nh * hd), oa(q.size()), ob(q.size());
  for (auto& v : q) v = 2.0f * dist(rng);
  const int64_t per = mb * nkv * bs * hd;
  std::vector<uint16_t> kc(per * layers), vc(per * layers);
  for (auto& v : kc) v = to_bf16(dist(rng));
  for (auto& v : vc) v = to_bf16(dist(rng));
  auto args = [&](int l, float* out) {
    fdk::AttnArgs a{q.data(), kc.data() + l * per, vc.data() + l * per, qsl.data(), lens.data(), bt.data(), 1, mb,
                    nh, nkv, bs, hd, 1.0f / std::sqrt((float)hd), out};
    a.kv_kind = fdk::kKvBF16;
    a.prompt_rows = marks.data();
    return a;
  };
  auto step = [&](bool use_b) {
    const unsigned long long t0 = __rdtsc();
    for (int l = 0; l < layers; ++l) {
      const fdk::AttnArgs a = args(l, use_b ? ob.data() : oa.data());
      if (w8)
        use_b ? fdk::B::w8::paged_attention(a) : fdk::A::w8::paged_attention(a);
      else
        use_b ? fdk::B::w16::paged_attention(a) : fdk::A::w16::paged_attention(a);
    }
    return __rdtsc() - t0;
  };
  step(false);
  step(true);
  double maxdiff = 0, maxabs = 0;
  for (size_t i = 0; i < oa.size(); ++i) {
    maxdiff = std::max(maxdiff, (double)std::fabs(oa[i] - ob[i]));
    maxabs = std::max(maxabs, (double)std::fabs(oa[i]));
  }
  std::vector<double> ra, rb;
  for (int p = 0; p < passes; ++p) {
    unsigned long long ta = ~0ull, tb = ~0ull;
    for (int r = 0; r < 3; ++r) {
      ta = std::min(ta, step(false));
      tb = std::min(tb, step(true));
    }
    ra.push_back(ta / 2.1e6 / layers);
    rb.push_back(tb / 2.1e6 / layers);
  }
  std::sort(ra.begin(), ra.end());
  std::sort(rb.begin(), rb.end());
  std::printf("w%d hd=%ld heads=%ld/%ld ctx=%ld layers=%d thr=%d |A-B| %.2e (max|A| %.2f)  ms/layer: "
              "A %.3f-%.3f (med %.3f)  B %.3f-%.3f (med %.3f)  B/A med %.3f\n",
              w8 ? 8 : 16, (long)hd, (long)nh, (long)nkv, (long)ctx, layers, threads, maxdiff, maxabs, ra.front(),
              ra.back(), ra[passes / 2], rb.front(), rb.back(), rb[passes / 2], rb[passes / 2] / ra[passes / 2]);
  return 0;
}
