// Instantiates kern_impl.h three times (AVX-512, AVX2+FMA, scalar) with per-namespace target pragmas,
// and dispatches each call to the best path the CPU supports. The library itself is compiled for a
// portable baseline, so only the chosen path ever executes wider instructions.
// FD_KERNELS_ISA=avx512bf16|avx512|avx2|scalar lowers the choice (never raises it above the CPU's).

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "amx_tiles.h"
#include "decode_region.h"
#include "dispatch.h"
#include "kernels.h"
#include "ranges.h"
#include "scratch.h"

namespace fdk {

#ifndef FD_AVX512_MR  // overridable for kernels/bench_native.cc experiments
#define FD_AVX512_MR 12
#endif

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,bmi2")
namespace isa_avx512 {
#define FD_W 16
#define FD_MR FD_AVX512_MR  // 24 accumulators + 2 weight vectors + 1 broadcast of the 32 zmm registers
#include "kern_impl.h"
#include "decode_region_impl.h"
#undef FD_W
#undef FD_MR
}  // namespace isa_avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace isa_avx2 {
#define FD_W 8
#define FD_MR 2  // 8 accumulators + 4 weight vectors + scales of the 16 ymm registers
#include "kern_impl.h"
#include "decode_region_impl.h"
#undef FD_W
#undef FD_MR
}  // namespace isa_avx2
#pragma GCC pop_options

namespace isa_scalar {
#define FD_W 1
#define FD_MR 4
#include "kern_impl.h"
#include "decode_region_impl.h"
#undef FD_W
#undef FD_MR
}  // namespace isa_scalar

static int detect_isa() {
  __builtin_cpu_init();
  int best = kIsaScalar;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = kIsaAvx2;
  if (best == kIsaAvx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    best = kIsaAvx512;
  if (best == kIsaAvx512 && amx::has_avx512_bf16()) best = kIsaAvx512Bf16;
  if (best == kIsaAvx512Bf16 && amx::usable()) best = kIsaAmx;
  static const struct {
    const char* name;
    int level;
  } kNames[] = {{"scalar", kIsaScalar}, {"avx2", kIsaAvx2}, {"avx512", kIsaAvx512}, {"avx512bf16", kIsaAvx512Bf16}};
  const char* env = std::getenv("FD_KERNELS_ISA");
  int want = best;
  for (const auto& n : kNames)
    if (env && std::strcmp(env, n.name) == 0) want = n.level;
  return std::min(best, want);
}

int active_isa() {
  static const int isa = detect_isa();  // decided once per process
  return isa;
}

// Rows from which the bf16 tiles beat the AVX-512 microkernel on quantized weights (each call repacks the
// weights to bf16, which only pays off over enough rows). FD_AMX_MIN_ROWS overrides, for benchmarks.
static int64_t amx_min_rows() {
  static const int64_t rows = [] {
    const char* env = std::getenv("FD_AMX_MIN_ROWS");
    return env ? std::max<int64_t>(1, std::atoll(env)) : (int64_t)8;
  }();
  return rows;
}

// Rows that are not prompt rows on the bf16 levels (and every row elsewhere): GGUF block kinds take the
// fixed-point int8 kernel, the others fp32.
static void gemm_fp32(const GemmArgs& g) {
  if (is_qkind(g.kind)) return qgemm(g);
  FD_DISPATCH(gemm, g);
}

int64_t prompt_tile_min_rows() { return active_isa() >= kIsaAvx512Bf16 ? amx_min_rows() : 0; }

// All rows in bf16: the tiles (AMX, or vdpbf16ps on them) for many rows, the AVX-512 microkernel on
// bf16-rounded operands for few. GGUF block kinds always take the tiles (the microkernel reads only the
// kS8 / kU4 panels); a tile row's result does not depend on the other rows, so that is the same numerics for
// any row count.
static bool takes_tiles(const GemmArgs& g) { return g.m >= amx_min_rows() || is_qkind(g.kind); }

static void gemm_bf16(const GemmArgs& g) {
  GemmArgs b = g;
  b.bf16 = true;
  if (takes_tiles(g)) return amx::gemm_bf16(b);
  std::vector<float> a(g.m * g.k);
  amx::round_rows_bf16(g.a, g.m, g.k, g.lda, a.data());
  b.a = a.data();
  b.lda = g.k;
  isa_avx512::gemm(b);
}

// The rows of g whose prompt flag is `prompt` through `path`. A serving step is mostly the running
// requests' generated-token rows followed by new prompts, so each kind is usually one run of consecutive
// rows, computed in place; scattered rows are gathered into scratch first and their results scattered
// back. A row's result depends on that row alone, so both ways compute the same numbers.
static void gemm_rows(const GemmArgs& g, const uint8_t* prompt_rows, bool prompt, void (*path)(const GemmArgs&)) {
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < g.m; ++r)
    if ((prompt_rows[r] != 0) == prompt) rows.push_back(r);
  const int64_t m = (int64_t)rows.size();
  GemmArgs s = g;
  s.m = m;
  if (rows.back() - rows.front() + 1 == m) {
    s.a = g.a + rows.front() * g.lda;
    s.c = g.c + rows.front() * g.n;
    return path(s);
  }
  // Uninitialized: every element is written before it is read. Copies split over the threads, since
  // a mixed prefill step moves megabytes here (docs/kernels-measurements.md).
  std::unique_ptr<float[]> a(new float[m * g.k]), c(new float[m * g.n]);
  const bool big = m * (g.k + g.n) >= (1 << 16);
#pragma omp parallel for schedule(static) if (big)
  for (int64_t i = 0; i < m; ++i) std::memcpy(&a[i * g.k], g.a + rows[i] * g.lda, g.k * sizeof(float));
  s.a = a.get();
  s.lda = g.k;
  s.c = c.get();
  path(s);
#pragma omp parallel for schedule(static) if (big)
  for (int64_t i = 0; i < m; ++i) std::memcpy(g.c + rows[i] * g.n, &c[i * g.n], g.n * sizeof(float));
}

// Prompt rows among g's m (0 where the bf16 levels' path does not apply at all).
static int64_t prompt_row_count(const GemmArgs& g, const uint8_t* prompt_rows) {
  if (active_isa() < kIsaAvx512Bf16 || g.kind == kF32 || !prompt_rows) return 0;
  int64_t np = 0;
  for (int64_t r = 0; r < g.m; ++r) np += prompt_rows[r] != 0;
  return np;
}

// The bf16 tile entries run g.epilogue themselves (amx.cc); every other path leaves it to gemm().
void gemm(const GemmArgs& g, const uint8_t* prompt_rows) {
  if (g.m == 0) return;
  const int64_t np = prompt_row_count(g, prompt_rows);
  if (np == g.m && takes_tiles(g)) return gemm_bf16(g);
  GemmArgs b = g;
  b.epilogue = nullptr;
  if (np == 0)
    gemm_fp32(b);
  else if (np == g.m)
    gemm_bf16(b);
  else {
    gemm_rows(b, prompt_rows, true, gemm_bf16);
    gemm_rows(b, prompt_rows, false, gemm_fp32);
  }
  if (g.epilogue) g.epilogue(g.epilogue_ctx, 0, g.m);
}

void gemm_silu_mul(const GemmArgs& g, float* gate_up, const uint8_t* prompt_rows) {
  if (g.m == 0) return;
  GemmArgs b = g;
  b.a = gate_up;
  if (prompt_row_count(g, prompt_rows) == g.m && takes_tiles(g)) {
    b.bf16 = true;
    return amx::gemm_bf16_silu_mul(b);
  }
  silu_and_mul_inplace(gate_up, g.m, g.k);
  gemm(b, prompt_rows);
}

bool gemm_gate_up_silu_down(const GemmArgs& gate_up, const GemmArgs& down, const uint8_t* prompt_rows) {
  const int64_t m = gate_up.m;
  if (m == 0 || down.m != m || !gate_up.tiles || !down.tiles || gate_up.bias || gate_up.epilogue) return false;
  if (down.k % 16 != 0 || gate_up.n != 2 * down.k) return false;
  if (prompt_row_count(gate_up, prompt_rows) != m || prompt_row_count(down, prompt_rows) != m) return false;
  if (!takes_tiles(gate_up) || !takes_tiles(down)) return false;
  GemmArgs gu = gate_up, d = down;
  gu.bf16 = d.bf16 = true;
  amx::gemm_gate_up_silu_down(gu, d);
  return true;
}

void rms_norm(const float* x, const float* w, float eps, int64_t t, int64_t h, float* out) {
  FD_DISPATCH(rms_norm, x, w, eps, t, h, out);
}

void fused_add_rms_norm(const float* x, const float* res, const float* w, float eps, int64_t t, int64_t h,
                        float* out, float* res_out) {
  FD_DISPATCH(fused_add_rms_norm, x, res, w, eps, t, h, out, res_out);
}

void silu_and_mul(const float* x, int64_t t, int64_t i, float* out) { FD_DISPATCH(silu_and_mul, x, t, i, out); }
void exp2_nonpos(const float* x, int64_t n, float* out) { FD_DISPATCH(exp2_nonpos, x, n, out); }

void rotary_embedding(const int64_t* pos, float* q, float* k, const float* cos_sin, int64_t t, int64_t nh,
                      int64_t nkv, int64_t hd, int64_t q_stride, int64_t k_stride) {
  FD_DISPATCH(rotary_embedding, pos, q, k, cos_sin, t, nh, nkv, hd, q_stride, k_stride);
}

void reshape_and_cache(const float* k, const float* v, float* kc, float* vc, const int64_t* slots, int64_t t,
                       int64_t nkv, int64_t bs, int64_t hd) {
  FD_DISPATCH(reshape_and_cache, k, v, kc, vc, slots, t, nkv, bs, hd);
}

void reshape_and_cache_s8(const float* k, const float* v, int8_t* kc, int8_t* vc, float* ks, float* vs,
                          const int64_t* slots, int64_t t, int64_t nkv, int64_t bs, int64_t hd) {
  FD_DISPATCH(reshape_and_cache_s8, k, v, kc, vc, ks, vs, slots, t, nkv, bs, hd);
}

void reshape_and_cache_bf16(const float* k, const float* v, uint16_t* kc, uint16_t* vc, const int64_t* slots,
                            int64_t t, int64_t nkv, int64_t bs, int64_t hd) {
  FD_DISPATCH(reshape_and_cache_bf16, k, v, kc, vc, slots, t, nkv, bs, hd);
}

void paged_attention(const AttnArgs& a) { FD_DISPATCH(paged_attention, a); }
void qkv_rope_to_cache(const QkvToCacheArgs& a) { FD_DISPATCH(qkv_rope_to_cache, a); }
void silu_and_mul_inplace(float* x, int64_t t, int64_t n) { FD_DISPATCH(silu_and_mul_inplace, x, t, n); }

void kv_s8_quantize(const float* x, int64_t rows, int64_t hd, int8_t* q, float* s) {
  FD_DISPATCH(kv_s8_quantize, x, rows, hd, q, s);
}

void kv_s8_dequantize(const int8_t* q, const float* s, int64_t rows, int64_t hd, float* out) {
  FD_DISPATCH(kv_s8_dequantize, q, s, rows, hd, out);
}

void kv_s8_quantize_bf16(const uint16_t* x, int64_t rows, int64_t hd, int8_t* q, float* s) {
  FD_DISPATCH(kv_s8_quantize_bf16, x, rows, hd, q, s);
}

void kv_s8_dequantize_bf16(const int8_t* q, const float* s, int64_t rows, int64_t hd, uint16_t* out) {
  FD_DISPATCH(kv_s8_dequantize_bf16, q, s, rows, hd, out);
}

namespace region {
bool attn_fits(int64_t group) { FD_DISPATCH(region_attn_fits, group); }
int64_t keys_per_part() { FD_DISPATCH(region_keys_per_part); }
void norm(const float* x, const float* w, float eps, int64_t t, int64_t h, float* out) {
  FD_DISPATCH(region_norm, x, w, eps, t, h, out);
}
void add_norm(const float* x, const float* res, const float* w, float eps, int64_t t, int64_t h, float* out,
              float* res_out) {
  FD_DISPATCH(region_add_norm, x, res, w, eps, t, h, out, res_out);
}
void silu(const float* gate_up, int64_t t, int64_t n, float* out) { FD_DISPATCH(region_silu, gate_up, t, n, out); }
void qkv_rows(const QkvToCacheArgs& a, int64_t r0, int64_t r1) { FD_DISPATCH(region_qkv_rows, a, r0, r1); }
void qkv_heads(const QkvToCacheArgs& a, int64_t r, int64_t g0, int64_t g1) {
  FD_DISPATCH(region_qkv_heads, a, r, g0, g1);
}
int64_t attn_item(const AttnArgs& a, const DecodeItem& w, float* parts, const DecodeItem* next, int64_t warm) {
  FD_DISPATCH(region_attn_item, a, w, parts, next, warm);
}
void attn_combine(const AttnArgs& a, const DecodeItem& first, int64_t nparts, const float* parts, float* w) {
  FD_DISPATCH(region_attn_combine, a, first, nparts, parts, w);
}
}  // namespace region

}  // namespace fdk
