// Standalone timing of the raw kernels (no Paddle): GEMM GFLOP/s for SmolLM2 shapes and paged attention.
// Build: g++ -O3 -std=c++17 -march=x86-64-v2 -fopenmp -Ikernels/fd_kernels/csrc kernels/bench_native.cc \
//            kernels/fd_kernels/csrc/{kernels,qgemm,amx}.cc -o /tmp/bench_native
// Used to tune block sizes on a quiet machine (add -DFD_GEMM_KC=... -DFD_GEMM_KC_MIN_ROWS=...,
// -DFD_AVX512_MR=...). With arguments "M K N" it times that one GEMM shape only; with "decode [layers]
// [repeats]", batch-1 decode's GEMMs against a plain read of their bytes, and with "head [repeats]" the LM
// head's (link Paddle's libiomp5, as the library does, for representative parallel-region costs:
// -L$LIBS -l:libiomp5.so -Wl,-rpath,$LIBS).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "kernels.h"

template <class F>
static double best_seconds(F fn, int reps) {
  fn();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

template <class F>
static double seconds(F fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

static void bench_gemm(int64_t m, int64_t k, int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist;
  const int64_t panels = (n + fdk::kNR - 1) / fdk::kNR;
  std::vector<float> a(m * k), c(m * n), w32(panels * k * fdk::kNR), sc(panels * ((k + 63) / 64) * fdk::kNR, 0.01f);
  std::vector<int8_t> w8(panels * k * fdk::kNR, 3);
  std::vector<uint8_t> w4(panels * k * fdk::kNR / 2, 0x35);
  for (auto& v : a) v = dist(rng);
  for (auto& v : w32) v = dist(rng);
  const int reps = 2 * m * n * k > (int64_t)2e8 ? 20 : 300;
  double gf[3];
  for (int kind = 0; kind < 3; ++kind) {
    const void* w = kind == 0 ? (const void*)w32.data() : kind == 1 ? (const void*)w8.data() : (const void*)w4.data();
    fdk::GemmArgs g{a.data(), k, m, k, n, w, sc.data(), sc.data(), kind == 1 ? k : 64, kind, nullptr, c.data()};
    gf[kind] = 2.0 * m * n * k / best_seconds([&] { fdk::gemm(g); }, reps) / 1e9;
  }
  std::printf("gemm %4ld x %4ld x %5ld: fp32 %6.1f  s8 %6.1f  u4 %6.1f GFLOP/s\n", (long)m, (long)k, (long)n, gf[0],
              gf[1], gf[2]);
}

// The GGUF block kernels (qgemm_impl.h): codes of one repeated byte and fp16 scales of 0.01 (the speed
// does not depend on the values).
static void bench_qgemm(int64_t m, int64_t k, int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist;
  const int64_t panels = (n + fdk::kQNR - 1) / fdk::kQNR, nb = k / fdk::kQBlock;
  std::vector<float> a(m * k), c(m * n);
  for (auto& v : a) v = dist(rng);
  const int reps = 2 * m * n * k > (int64_t)2e8 ? 20 : 300;
  double gf[3];
  const int kinds[3] = {fdk::kQ4_0, fdk::kQ4_1, fdk::kQ8_0};
  for (int i = 0; i < 3; ++i) {
    const int64_t rec = fdk::q_record_bytes(kinds[i]);
    std::vector<uint8_t> w(panels * nb * rec, 0x35);
    for (int64_t r = 0; r < panels * nb; ++r)
      for (int j = 0; j < fdk::q_codes_offset(kinds[i]) / 2; ++j) {
        const uint16_t h = 0x211F;  // fp16 0.01
        std::memcpy(&w[r * rec + 2 * j], &h, 2);
      }
    fdk::GemmArgs g{a.data(), k, m, k, n, w.data(), nullptr, nullptr, 0, kinds[i], nullptr, c.data()};
    gf[i] = 2.0 * m * n * k / best_seconds([&] { fdk::gemm(g); }, reps) / 1e9;
  }
  std::printf("gguf %4ld x %4ld x %5ld: q4_0 %6.1f  q4_1 %6.1f  q8_0 %6.1f GFLOP/s\n", (long)m, (long)k, (long)n,
              gf[0], gf[1], gf[2]);
}

static void bench_attention(const char* name, std::vector<int64_t> q_lens, std::vector<int64_t> ctx) {
  const int64_t nh = 9, nkv = 3, hd = 64, bs = 16, b = (int64_t)ctx.size();
  int64_t max_blocks = 0, t = 0;
  for (int64_t c : ctx) max_blocks = std::max(max_blocks, (c + bs - 1) / bs);
  std::vector<int64_t> qsl(b + 1, 0), bt(b * max_blocks);
  for (int64_t i = 0; i < b; ++i) qsl[i + 1] = qsl[i] + q_lens[i];
  t = qsl[b];
  for (int64_t i = 0; i < b * max_blocks; ++i) bt[i] = i;
  std::vector<float> q(t * nh * hd, 0.1f), kc(b * max_blocks * nkv * bs * hd, 0.2f), vc(kc.size(), 0.3f), out(q.size());
  fdk::AttnArgs args{q.data(), kc.data(), vc.data(), qsl.data(), ctx.data(), bt.data(), b, max_blocks, nh, nkv, bs,
                     hd, 0.125f, out.data()};
  std::printf("attention %-22s %8.3f ms\n", name, 1e3 * best_seconds([&] { fdk::paged_attention(args); }, 30));
}

// A plain read of p[0, bytes) split over the threads: csrc/qgemm.cc's fd_read_bytes, the roofline's probe.
extern "C" uint64_t fd_read_bytes(const uint8_t* p, int64_t bytes);
static void read_all(const uint8_t* p, int64_t bytes) {
  volatile uint64_t sink = fd_read_bytes(p, bytes);
  (void)sink;
}

// Batch-1 decode's GEMMs: `layers` x SmolLM2-135M's four Q4_1 linears at one row, each layer's weights
// distinct (as a step streams them; every byte one value: the speed does not depend on it), against a plain read of as many bytes, alternated in each repeat;
// then the per-call pieces: an empty parallel region and a one-panel call (activation quantization and
// setup, no parallel region).
static void bench_decode(int layers, int reps) {
  const int64_t shapes[4][2] = {{960, 576}, {576, 576}, {3072, 576}, {576, 1536}};
  const int kind = fdk::kQ4_1;
  const int64_t rec = fdk::q_record_bytes(kind);
  std::vector<std::vector<uint8_t>> w;
  std::vector<fdk::GemmArgs> calls;
  std::vector<float> a(1536, 0.5f), c(3072);
  int64_t bytes = 0;
  for (int l = 0; l < layers; ++l)
    for (auto& s : shapes) {
      w.emplace_back((s[0] + 15) / 16 * (s[1] / 32) * rec, (uint8_t)(0x35 + l));
      bytes += (int64_t)w.back().size();
      calls.push_back({a.data(), s[1], 1, s[1], s[0], w.back().data(), nullptr, nullptr, 0, kind, nullptr, c.data()});
    }
  std::vector<uint8_t> buf(bytes, 1);
  auto step = [&] {
    for (auto& g : calls) fdk::gemm(g);
  };
  double t_read = 1e30, t_gemm = 1e30;
  for (int r = 0; r < reps; ++r) {
    t_read = std::min(t_read, seconds([&] { read_all(buf.data(), bytes); }));
    t_gemm = std::min(t_gemm, seconds(step));
  }
  const double t_region = best_seconds([] {
    for (int i = 0; i < 1000; ++i) {
#pragma omp parallel
      asm volatile("");
    }
  }, 20) / 1000;
  fdk::GemmArgs one = calls[1];
  one.n = 16;  // one panel: a single work item, no parallel region
  const double t_one = best_seconds([&] { for (int i = 0; i < 1000; ++i) fdk::gemm(one); }, 20) / 1000;
  const double n = (double)calls.size();
  std::printf("decode GEMMs: %zu calls, %.1f MB: %.3f ms; plain read %.3f ms (%.1f GB/s); ratio %.2fx, "
              "%+.2f us per call\n", calls.size(), bytes / 1e6, t_gemm * 1e3, t_read * 1e3, bytes / t_read / 1e9,
              t_gemm / t_read, (t_gemm - t_read) / n * 1e6);
  std::printf("per call: empty parallel region %.2f us, one-panel call %.2f us\n", t_region * 1e6, t_one * 1e6);
}

// Batch-1 decode's LM head: SmolLM2-135M's tied Q8_0 embedding (49152 x 576) at one row, alternated with a
// plain read of as many bytes, best of the repeats.
static void bench_head(int reps) {
  const int64_t n = 49152, k = 576, rec = fdk::q_record_bytes(fdk::kQ8_0);
  std::vector<uint8_t> w(n / 16 * (k / 32) * rec, 0x35), buf(w.size(), 1);
  std::vector<float> a(k, 0.5f), c(n);
  fdk::GemmArgs g{a.data(), k, 1, k, n, w.data(), nullptr, nullptr, 0, fdk::kQ8_0, nullptr, c.data()};
  double t_read = 1e30, t_gemm = 1e30;
  for (int r = 0; r < reps; ++r) {
    t_read = std::min(t_read, seconds([&] { read_all(buf.data(), (int64_t)buf.size()); }));
    t_gemm = std::min(t_gemm, seconds([&] { fdk::gemm(g); }));
  }
  std::printf("LM head: %.1f MB: %.3f ms; plain read %.3f ms (%.1f GB/s); ratio %.2fx\n", w.size() / 1e6,
              t_gemm * 1e3, t_read * 1e3, w.size() / t_read / 1e9, t_gemm / t_read);
}

int main(int argc, char** argv) {
  std::mt19937 rng(0);
  if (argc >= 2 && std::strcmp(argv[1], "head") == 0) {  // head [repeats]
    bench_head(argc > 2 ? std::atoi(argv[2]) : 50);
    return 0;
  }
  if (argc >= 2 && std::strcmp(argv[1], "decode") == 0) {  // decode [layers] [repeats]
    bench_decode(argc > 2 ? std::atoi(argv[2]) : 30, argc > 3 ? std::atoi(argv[3]) : 50);
    return 0;
  }
  if (argc == 4) {  // one GEMM shape: M K N
    bench_gemm(std::atol(argv[1]), std::atol(argv[2]), std::atol(argv[3]), rng);
    return 0;
  }
  std::printf("threads=%d isa=%d\n", omp_get_max_threads(), fdk::active_isa());
  const int64_t shapes[][3] = {{1, 576, 1536}, {16, 576, 1536}, {512, 576, 1536}, {512, 1536, 576}, {512, 576, 960},
                               {1, 576, 49152}};
  for (auto& s : shapes) bench_gemm(s[0], s[1], s[2], rng);
  for (auto& s : shapes) bench_qgemm(s[0], s[1], s[2], rng);
  bench_attention("decode B=1 ctx=512", {1}, {512});
  bench_attention("decode B=16 ctx=512", std::vector<int64_t>(16, 1), std::vector<int64_t>(16, 512));
  bench_attention("prefill 512", {512}, {512});
  return 0;
}
