// A/B timing of decode attention: two copies of kern_impl.h (FD_A_DIR: a saved tree, FD_B_DIR: this one)
// in separate namespaces, alternated pass by pass on the same caches. Build (from the repo root):
//   g++ -O3 -std=c++17 -march=x86-64-v2 -fopenmp -Ikernels/fd_kernels/csrc \
//       -DFD_A_IMPL='"/tmp/old/kern_impl.h"' -DFD_B_IMPL='"kern_impl.h"' kernels/bench_attn_ab.cc \
//       kernels/fd_kernels/csrc/{kernels,qgemm,amx}.cc -o /tmp/bench_attn_ab
// Run: bench_attn_ab ISA(16|8) BATCH CTX LAYERS PASSES THREADS [SCATTER] [PREFILL] [C8] [HUGE]. LAYERS distinct caches (bf16,
// SmolLM2's 9 / 3 heads, hd 64, block 16, each sequence's blocks consecutive) are read once per timed step,
// as a decode step's 30 layers stream them; LAYERS 1 keeps one layer's cache hot (in L3 at batch 16; batch 2
// fits L2). SCATTER 1 permutes the block table over the pool, as a serving pool's free list leaves it.
// PREFILL 1: each sequence's queries are its whole context, marked as prompt rows (the AMX level's prompt
// attention at ISA 16 on an AMX CPU); the figures are then cycles per key per group over the step's queries.
// C8 1: the C8 cache (int8 codes, one fp32 scale a row) instead of bf16. HUGE 1: the caches on 2 MB pages
// (MADV_HUGEPAGE, as the engine's KV cache: csrc/huge_pages.cc), else whatever malloc gives (4 KiB pages
// where THP is `madvise`). Environment HD: the head size instead of 64; VOFF: the bf16 value cache starts VOFF
// elements past its 2 MB-aligned allocation (moves values and keys of a block apart modulo 4 KiB).
#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>
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

// Vectors whose storage is advised onto 2 MB pages before it is first touched (when g_huge).
static bool g_huge = false;
template <class T>
struct HugeAlloc {
  using value_type = T;
  HugeAlloc() = default;
  template <class U>
  HugeAlloc(const HugeAlloc<U>&) {}
  T* allocate(size_t n) {
    const size_t bytes = (n * sizeof(T) + (2u << 20) - 1) / (2u << 20) * (2u << 20);
    void* p = std::aligned_alloc(2u << 20, bytes);
    if (!p) throw std::bad_alloc();
    if (g_huge) madvise(p, bytes, MADV_HUGEPAGE);
    return (T*)p;
  }
  void deallocate(T* p, size_t) { std::free(p); }
  bool operator==(const HugeAlloc&) const { return true; }
  bool operator!=(const HugeAlloc&) const { return false; }
};
template <class T>
using hvec = std::vector<T, HugeAlloc<T>>;

extern "C" uint64_t fd_read_bytes(const uint8_t* p, int64_t bytes);  // csrc/qgemm.cc: the roofline probe

int main(int argc, char** argv) {
  const int isa = argc > 1 ? std::atoi(argv[1]) : 16;
  const int64_t b = argc > 2 ? std::atol(argv[2]) : 16, ctx = argc > 3 ? std::atol(argv[3]) : 512;
  const int layers = argc > 4 ? std::atoi(argv[4]) : 30, passes = argc > 5 ? std::atoi(argv[5]) : 10;
  const int threads = argc > 6 ? std::atoi(argv[6]) : 2;
  const bool scatter = argc > 7 && std::atoi(argv[7]) != 0;
  const bool prefill = argc > 8 && std::atoi(argv[8]) != 0;
  const bool c8 = argc > 9 && std::atoi(argv[9]) != 0;
  g_huge = argc > 10 && std::atoi(argv[10]) != 0;
  omp_set_num_threads(threads);
  const int64_t hd = std::getenv("HD") ? std::atol(std::getenv("HD")) : 64;  // a multiple of 16
  const int64_t nh = 9, nkv = 3, bs = 16, mb = (ctx + bs - 1) / bs, nblocks = b * mb;
  std::mt19937 rng(0);
  std::normal_distribution<float> dist;
  std::vector<int64_t> qsl(b + 1), lens(b, ctx), bt(b * mb);
  const int64_t nq = prefill ? ctx : 1;  // queries per sequence
  for (int64_t i = 0; i <= b; ++i) qsl[i] = i * nq;
  std::vector<uint8_t> prompt(b * nq, 1);
  for (int64_t i = 0; i < b * mb; ++i) bt[i] = i;
  if (scatter) std::shuffle(bt.begin(), bt.end(), rng);
  std::vector<float> q(b * nq * nh * hd), oa(q.size()), ob(q.size());
  for (auto& v : q) v = dist(rng);
  const int64_t per = nblocks * nkv * bs * hd;
  const int64_t voff = std::getenv("VOFF") ? std::atol(std::getenv("VOFF")) : 0;
  hvec<uint16_t> kc(per * layers), vc(per * layers + voff);
  for (auto& v : kc) v = to_bf16(dist(rng));
  for (auto& v : vc) v = to_bf16(dist(rng));
  const int64_t srows = nblocks * nkv * bs;  // C8: codes and scales per layer
  hvec<int8_t> kq(c8 ? per * layers : 0), vq(kq.size());
  hvec<float> ks(c8 ? srows * layers : 0), vs(ks.size());
  std::uniform_int_distribution<int> code(-127, 127);
  for (auto& v : kq) v = (int8_t)code(rng);
  for (auto& v : vq) v = (int8_t)code(rng);
  for (auto& v : ks) v = std::fabs(dist(rng)) / 127.0f;
  for (auto& v : vs) v = std::fabs(dist(rng)) / 127.0f;
  auto args = [&](int l, float* out) {
    fdk::AttnArgs a{q.data(), kc.data() + l * per, vc.data() + voff + l * per, qsl.data(), lens.data(),
                    bt.data(), b, mb, nh, nkv, bs, hd, 0.125f, out};
    a.kv_kind = fdk::kKvBF16;
    if (c8) {
      a.k_cache = kq.data() + l * per;
      a.v_cache = vq.data() + l * per;
      a.k_scales = ks.data() + l * srows;
      a.v_scales = vs.data() + l * srows;
      a.kv_kind = fdk::kKvS8;
    }
    if (prefill) a.prompt_rows = prompt.data();
    return a;
  };
  auto step = [&](bool use_b) {
    const unsigned long long t0 = __rdtsc();
    for (int l = 0; l < layers; ++l) {
      const fdk::AttnArgs a = args(l, use_b ? ob.data() : oa.data());
      if (isa == 16) use_b ? fdk::B::w16::paged_attention(a) : fdk::A::w16::paged_attention(a);
      else use_b ? fdk::B::w8::paged_attention(a) : fdk::A::w8::paged_attention(a);
    }
    return __rdtsc() - t0;
  };
  step(false);
  step(true);
  double maxdiff = 0;
  for (size_t i = 0; i < oa.size(); ++i) maxdiff = std::max(maxdiff, (double)std::fabs(oa[i] - ob[i]));
  const double keys = (double)b * nkv * ctx * layers * (prefill ? (ctx + 1) / 2.0 : 1.0);  // key x group visits
  std::vector<double> ra, rb;
  for (int p = 0; p < passes; ++p) {
    unsigned long long ta = ~0ull, tb = ~0ull;
    for (int r = 0; r < 3; ++r) {
      ta = std::min(ta, step(false));
      tb = std::min(tb, step(true));
    }
    ra.push_back(ta * threads / keys);
    rb.push_back(tb * threads / keys);
  }
  unsigned long long tr = ~0ull;  // a plain read of the step's K and V bytes, as many threads
  for (int r = 0; r < 5; ++r) {
    const unsigned long long t0 = __rdtsc();
    volatile uint64_t sink =
        c8 ? fd_read_bytes((const uint8_t*)kq.data(), (int64_t)kq.size()) +
                 fd_read_bytes((const uint8_t*)vq.data(), (int64_t)vq.size())
           : fd_read_bytes((const uint8_t*)kc.data(), (int64_t)(kc.size() * 2)) +
                 fd_read_bytes((const uint8_t*)vc.data(), (int64_t)(vc.size() * 2));
    (void)sink;
    tr = std::min(tr, __rdtsc() - t0);
  }
  std::printf("read of %.1f MB: %.1f TSC cycles/key/group (x threads)\n", (c8 ? kq.size() * 2 : kc.size() * 4) / 1e6,
              tr * threads / keys);
  std::sort(ra.begin(), ra.end());
  std::sort(rb.begin(), rb.end());
  auto ms = [&](double c) { return c * keys / threads / 2.1e6; };  // TSC 2.1 GHz
  std::printf("isa %d B=%ld ctx=%ld layers=%d thr=%d scatter=%d prefill=%d c8=%d huge=%d |A-B| %.2e  TSC cycles/key/group (x threads): "
              "A %.1f-%.1f (med %.1f)  B %.1f-%.1f (med %.1f)  B/A med %.3f  [A ~%.2f ms, B ~%.2f ms by TSC]\n",
              isa, (long)b, (long)ctx, layers, threads, (int)scatter, (int)prefill, (int)c8, (int)g_huge, maxdiff, ra.front(), ra.back(), ra[passes / 2], rb.front(),
              rb.back(), rb[passes / 2], rb[passes / 2] / ra[passes / 2], ms(ra[passes / 2]), ms(rb[passes / 2]));
  return 0;
}
