// A/B timing of the bf16 prompt-row GEMM (AMX tiles, or vdpbf16ps on a CPU without AMX): a saved copy of
// amx.cc (FD_A_SRC, compiled into namespace fdk_old) against this tree's, alternated pass by pass on the
// same prepacked tiles, results compared bit for bit. Build (from the repo root, LIBS = Paddle's libs
// directory, for its libiomp5):
//   g++ -O3 -std=c++17 -march=x86-64-v2 -fopenmp -Ikernels/fd_kernels/csrc -Dfdk=fdk_old -c /tmp/old/amx.cc \
//       -o /tmp/amx_old.o
//   g++ -O3 -std=c++17 -march=x86-64-v2 -fopenmp -Ikernels/fd_kernels/csrc kernels/bench_amx_ab.cc \
//       kernels/fd_kernels/csrc/amx.cc kernels/fd_kernels/csrc/huge_pages.cc /tmp/amx_old.o -o /tmp/bench_amx_ab \
//       -L$LIBS -l:libiomp5.so -Wl,-rpath,$LIBS
// Run: bench_amx_ab M K N WEIGHTS PASSES. WEIGHTS 1 repeats one weight (hot in L2/L3, as
// bench_prefill_gemm.py); WEIGHTS 30 cycles through 30 distinct weights, as a step's 30 layers read them.
// Prints per pass old and new GFLOP/s (best call) and new / old. FD_SILU=1 runs the fused silu(gate) * up
// conversion, FD_EPI=1 passes a no-op row epilogue. `stack M PASSES`: see stack(); `chain M PASSES`: chain().
#include <immintrin.h>
#include <malloc.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "huge_pages.h"
#include "kernels.h"

// The saved amx.cc, compiled separately with -Dfdk=fdk_old (same GemmArgs layout).
namespace fdk_old {
struct GemmArgs;
namespace amx {
void gemm_bf16(const GemmArgs& g);
void gemm_bf16_silu_mul(const GemmArgs& g);
}  // namespace amx
}  // namespace fdk_old

// The level amx.cc runs at here (kernels.cc is not linked): AMX tiles where the process may use them,
// else vdpbf16ps; a saved amx.cc that asks (-Dfdk=fdk_old) gets the same answer.
int fdk::active_isa() { return fdk::amx::usable() ? fdk::kIsaAmx : fdk::kIsaAvx512Bf16; }
namespace fdk_old {
int active_isa() { return fdk::active_isa(); }
}  // namespace fdk_old

namespace fdk_old_wrap {
void gemm(const fdk::GemmArgs& g) { fdk_old::amx::gemm_bf16(*(const fdk_old::GemmArgs*)&g); }
void gemm_silu(const fdk::GemmArgs& g) { fdk_old::amx::gemm_bf16_silu_mul(*(const fdk_old::GemmArgs*)&g); }
}  // namespace fdk_old_wrap

// Page-aligned storage, as Paddle allocates tensors: a std::vector's data sits 16 bytes into its block, so
// every 64-byte tile row of C or of the weight would straddle two cache lines.
template <class T>
struct PageAllocator {
  using value_type = T;
  PageAllocator() = default;
  template <class U>
  PageAllocator(const PageAllocator<U>&) {}
  T* allocate(size_t n) {
    const size_t bytes = (n * sizeof(T) + 4095) / 4096 * 4096;
    T* p = (T*)std::aligned_alloc(4096, bytes);
    // As an op's output from output_blocks.h's kOutputBlockMinBytes (32 MB) up, which needs Paddle's headers.
    if (bytes >= (size_t{32} << 20)) fdk::advise_huge_pages(p, (int64_t)bytes);
    return p;
  }
  void deallocate(T* p, size_t) { std::free(p); }
  template <class U>
  bool operator==(const PageAllocator<U>&) const { return true; }
  template <class U>
  bool operator!=(const PageAllocator<U>&) const { return false; }
};
template <class T>
using Buf = std::vector<T, PageAllocator<T>>;

static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// PASSES passes of the best of 3 alternated steps each (step(neu, sec): sec[i] += shape i's time), printed
// as old and new ms, old / new in all and per shape.
template <class Step>
static int ab_passes(const char* mode, int64_t m, int passes, Step step) {
  for (int p = 0; p < passes; ++p) {
    double best[2][5];
    for (auto& b : best) std::fill(b, b + 5, 1e30);
    for (int r = 0; r < 3; ++r)
      for (int j = 0; j < 2; ++j) {
        const bool neu = (j + p) % 2;  // old first on even passes, new first on odd ones
        double sec[4] = {};
        step(neu, sec);
        for (int i = 0; i < 4; ++i) best[neu][i] = std::min(best[neu][i], sec[i]);
        best[neu][4] = std::min(best[neu][4], sec[0] + sec[1] + sec[2] + sec[3]);
      }
    std::printf("%s m %ld pass %d: old %.2f new %.2f ms, old/new %.3f; qkv %.3f o %.3f gate_up %.3f down %.3f\n",
                mode, (long)m, p, best[0][4] * 1e3, best[1][4] * 1e3, best[0][4] / best[1][4],
                best[0][0] / best[1][0], best[0][1] / best[1][1], best[0][2] / best[1][2], best[0][3] / best[1][3]);
    std::printf("  new ms qkv %.2f o %.2f gate_up %.2f down %.2f\n", best[1][0] * 1e3, best[1][1] * 1e3,
                best[1][2] * 1e3, best[1][3] * 1e3);
  }
  return 0;
}

// SmolLM2-135M's four prompt GEMMs (qkv, o_proj, gate_up, down) over 30 layers of distinct weights in a
// step's order, ~212 MB of bf16 tiles: per pass the best of 3 steps (alternated) in ms, and old / new per shape.
static int stack(int64_t m, int passes) {
  if (!fdk::amx::has_avx512_bf16()) return std::fprintf(stderr, "no AVX512-BF16\n"), 1;
  const int64_t shapes[4][2] = {{576, 960}, {576, 576}, {576, 3072}, {1536, 576}};
  constexpr int kLayers = 30;
  std::mt19937 rng(1);
  Buf<float> a(m * 1536);
  for (auto& x : a) x = (float)(rng() % 2001) / 1000.0f - 1.0f;
  std::vector<Buf<uint16_t>> tiles(kLayers * 4);
  std::vector<Buf<float>> c(4);
  for (int l = 0; l < kLayers; ++l)
    for (int i = 0; i < 4; ++i) {
      auto& t = tiles[l * 4 + i];
      t.resize(fdk::amx::tiles_elems(shapes[i][1], shapes[i][0]));
      for (auto& x : t) x = (uint16_t)(0x3c00 + rng() % 0x200 + (rng() & 1) * 0x8000);  // |x| in [2^-7, 2^-6)
      c[i].resize(m * shapes[i][1]);
    }
  // One step; sec[i] += shape i's time over the 30 layers.
  auto step = [&](bool neu, double* sec) {
    for (int l = 0; l < kLayers; ++l)
      for (int i = 0; i < 4; ++i) {
        fdk::GemmArgs g{};
        g.a = a.data(), g.lda = shapes[i][0], g.m = m, g.k = shapes[i][0], g.n = shapes[i][1];
        g.kind = fdk::kS8, g.group = g.k, g.c = c[i].data(), g.tiles = tiles[l * 4 + i].data();
        const double t0 = now();
        if (neu) fdk::amx::gemm_bf16(g); else fdk_old_wrap::gemm(g);
        sec[i] += now() - t0;
      }
  };
  double warm[4] = {};
  step(false, warm), step(true, warm);
  return ab_passes("stack", m, passes, step);
}

// The decoder stack's residual add + RMSNorm epilogue (kern_impl.h's fused_add_rms_norm at the AVX-512 level,
// same two passes a row), for `chain`.
struct AddNorm {
  const float* x;
  float* residual;
  const float* w;
  float* out;
  int64_t h;
};
__attribute__((target("avx512f"))) static void add_norm_rows(void* ctx, int64_t r0, int64_t r1) {
  const AddNorm& n = *static_cast<const AddNorm*>(ctx);
  for (int64_t r = r0; r < r1; ++r) {
    const float* x = n.x + r * n.h;
    float* s = n.residual + r * n.h;
    float* o = n.out + r * n.h;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n.h; i += 16)
      _mm512_storeu_ps(s + i, _mm512_add_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(s + i)));
    for (int64_t i = 0; i < n.h; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(s + i), _mm512_loadu_ps(s + i), acc);
    const __m512 iv = _mm512_set1_ps(1.0f / std::sqrt(_mm512_reduce_add_ps(acc) / (float)n.h + 1e-5f));
    for (int64_t i = 0; i < n.h; i += 16)
      _mm512_storeu_ps(o + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(s + i), iv), _mm512_loadu_ps(n.w + i)));
  }
}

// As `stack`, but each layer's GEMMs chained as the decoder stack runs them: qkv and gate_up read the normed
// rows, o_proj (A: a fixed attention output) and down_proj (A: silu(gate) * up of gate_up's output, fused
// into its conversion) run the add + norm epilogue into the residual and the normed rows. Old and new each
// run one step from the same state first and their residuals are compared bit for bit. Caveat: without
// attention and the QKV pass between the GEMMs its down_proj ran ~1.6x the stack's time and ranked variants
// differently from a real prefill (docs/kernels-measurements.md); confirm in process before adopting.
static int chain(int64_t m, int passes) {
  if (!fdk::amx::has_avx512_bf16()) return std::fprintf(stderr, "no AVX512-BF16\n"), 1;
  const int64_t shapes[4][2] = {{576, 960}, {576, 576}, {576, 3072}, {1536, 576}};
  constexpr int kLayers = 30;
  std::mt19937 rng(1);
  Buf<float> attn(m * 576), res0(m * 576), res(m * 576), normed(m * 576), hidden(m * 576), qkv(m * 960),
      gu(m * 3072), w(576, 1.0f);
  for (auto& x : attn) x = (float)(rng() % 2001) / 1000.0f - 1.0f;
  for (auto& x : res0) x = (float)(rng() % 2001) / 1000.0f - 1.0f;
  std::vector<Buf<uint16_t>> tiles(kLayers * 4);
  for (int l = 0; l < kLayers; ++l)
    for (int i = 0; i < 4; ++i) {
      auto& t = tiles[l * 4 + i];
      t.resize(fdk::amx::tiles_elems(shapes[i][1], shapes[i][0]));
      for (auto& x : t) x = (uint16_t)(0x3c00 + rng() % 0x200 + (rng() & 1) * 0x8000);
    }
  AddNorm an{hidden.data(), res.data(), w.data(), normed.data(), 576};
  auto step = [&](bool neu, double* sec) {
    std::memcpy(res.data(), res0.data(), m * 576 * 4), std::memcpy(normed.data(), res0.data(), m * 576 * 4);
    for (int l = 0; l < kLayers; ++l)
      for (int i = 0; i < 4; ++i) {
        fdk::GemmArgs g{};
        g.lda = shapes[i][0], g.m = m, g.k = shapes[i][0], g.n = shapes[i][1];
        g.kind = fdk::kS8, g.group = g.k, g.tiles = tiles[l * 4 + i].data();
        const bool silu = i == 3;
        g.a = i == 1 ? attn.data() : silu ? gu.data() : normed.data();
        if (silu) g.lda = 3072;
        g.c = i == 0 ? qkv.data() : i == 2 ? gu.data() : hidden.data();
        if (i == 1 || i == 3) g.epilogue = add_norm_rows, g.epilogue_ctx = &an;
        const double t0 = now();
        if (neu)
          silu ? fdk::amx::gemm_bf16_silu_mul(g) : fdk::amx::gemm_bf16(g);
        else
          silu ? fdk_old_wrap::gemm_silu(g) : fdk_old_wrap::gemm(g);
        sec[i] += now() - t0;
      }
  };
  double warm[4] = {};
  step(false, warm);
  Buf<float> ref(res);
  step(true, warm);
  // FD_NOCHECK=1 for timing-only variants of amx.cc.
  if (!getenv("FD_NOCHECK") && std::memcmp(ref.data(), res.data(), m * 576 * 4))
    return std::fprintf(stderr, "MISMATCH\n"), 1;
  return ab_passes("chain", m, passes, step);
}

int main(int argc, char** argv) {
  // The heap thresholds the engine process sets (fd_kernels.native._keep_freed_memory): without them every
  // call's A tiles above glibc's mmap threshold (6 MB at M = 2048, K = 1536) are a fresh mapping, faulted
  // in page by page, which the engine never pays.
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 128 << 20);
  if (argc == 4 && std::string(argv[1]) == "stack") return stack(atol(argv[2]), atoi(argv[3]));
  if (argc == 4 && std::string(argv[1]) == "chain") return chain(atol(argv[2]), atoi(argv[3]));
  if (argc < 6) return std::fprintf(stderr, "usage: M K N WEIGHTS PASSES | stack M PASSES | chain M PASSES\n"), 2;
  const int64_t m = atol(argv[1]), k = atol(argv[2]), n = atol(argv[3]);
  const int nw = atoi(argv[4]), passes = atoi(argv[5]);
  if (!fdk::amx::has_avx512_bf16()) return std::fprintf(stderr, "no AVX512-BF16\n"), 1;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  // FD_SILU=1: the fused silu(gate) * up conversion (gemm_bf16_silu_mul), each row [gate | up] of 2k values.
  const bool silu = getenv("FD_SILU") && atoi(getenv("FD_SILU"));
  Buf<float> a(m * k * (silu ? 2 : 1));
  for (auto& x : a) x = u(rng);
  const int64_t panels = (n + fdk::kNR - 1) / fdk::kNR, te = fdk::amx::tiles_elems(n, k);
  std::vector<Buf<uint16_t>> tiles(nw, Buf<uint16_t>(te));
  std::vector<int8_t> q(panels * k * fdk::kNR);
  std::vector<float> s(panels * fdk::kNR, 0.01f);
  for (int w = 0; w < nw; ++w) {
    for (auto& x : q) x = (int8_t)(rng() % 255 - 127);
    fdk::GemmArgs g{};
    g.k = k, g.n = n, g.w = q.data(), g.scales = s.data(), g.group = k, g.kind = fdk::kS8;
    fdk::amx::pack_tiles(g, tiles[w].data());
  }
  Buf<float> c0(m * n), c1(m * n);
  // FD_EPI=1: with a row epilogue that does nothing (the decoder stack's calls carry one; see amx.cc's plans).
  const bool epi = getenv("FD_EPI") && atoi(getenv("FD_EPI"));
  auto args = [&](int w, float* c) {
    fdk::GemmArgs g{};
    g.a = a.data(), g.lda = silu ? 2 * k : k, g.m = m, g.k = k, g.n = n, g.kind = fdk::kS8, g.group = k, g.c = c;
    g.tiles = tiles[w].data();
    if (epi) g.epilogue = [](void*, int64_t, int64_t) {};
    return g;
  };
  const double flop = 2.0 * m * n * k;
  // Best single call: with 30 weights every call's weight was last read 29 calls (~20 MB of tiles) ago.
  auto run = [&](bool neu, float* c) {
    double best = 1e30;
    const int sweeps = nw == 1 ? 30 : 4;
    for (int r = 0; r < sweeps; ++r) {
      for (int w = 0; w < nw; ++w) {
        const auto g = args(w, c);
        const double t0 = now();
        if (neu)
          silu ? fdk::amx::gemm_bf16_silu_mul(g) : fdk::amx::gemm_bf16(g);
        else
          silu ? fdk_old_wrap::gemm_silu(g) : fdk_old_wrap::gemm(g);
        best = std::min(best, now() - t0);
      }
    }
    return flop / best / 1e9;
  };
  run(false, c0.data()), run(true, c1.data());
  if (!getenv("FD_NOCHECK") && std::memcmp(c0.data(), c1.data(), c0.size() * 4))
    return std::fprintf(stderr, "MISMATCH\n"), 1;
  for (int p = 0; p < passes; ++p) {
    const double o = run(false, c0.data()), nn = run(true, c1.data());
    std::printf("%ld %ld %ld w%d pass %d: old %6.0f new %6.0f ratio %.3f\n", (long)m, (long)k, (long)n, nw, p, o, nn, nn / o);
  }
  return 0;
}
