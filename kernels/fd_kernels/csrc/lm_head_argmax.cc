// fd_linear_argmax: each row's first argmax of x @ W^T (+ b), the LM head and a plain greedy sampler in one
// op. The logits are fd_linear's, bit for bit: the same fdk::gemm call (no prompt rows, as the LM head
// passes none), into a scratch buffer this op keeps, so no output tensor is allocated and nothing on the
// host reads them. The rows are then scanned for (max, first index, any NaN), over many rows by each
// thread on its contiguous share of the columns, the shares combined in column order: the result is numpy's
// argmax of the row (ties to the lowest index) whatever the thread count. A row holding a NaN gives -1:
// the greedy fast path leaves such rows to the sampling op's own NaN rule, so the caller must take the full
// path for them.

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "argmax_rows.h"
#include "decoder_stack.h"
#include "glue.h"
#include "kernels.h"
#include "paddle/extension.h"

namespace {

using paddle::Tensor;

using fdk::ArgMax;

// r continued over p[i, n), one value at a time (strictly greater replaces: the first index stays).
ArgMax scan_from(ArgMax r, const float* p, int64_t i, int64_t n) {
  for (; i < n; ++i) {
    if (p[i] > r.best) r.best = p[i], r.index = i;
    r.nan |= std::isnan(p[i]);
  }
  return r;
}

ArgMax argmax_scalar(const float* p, int64_t n) { return scan_from(ArgMax{p[0], 0, std::isnan(p[0])}, p, 1, n); }

// The vector paths' end: L lanes' (value, first index) merged (larger value, or equal value and smaller
// index), then the values from i on, which come after every lane's.
template <int L>
ArgMax merge_lanes(const float* bv, const int32_t* bi, bool nan, const float* p, int64_t i, int64_t n) {
  ArgMax r{bv[0], bi[0], nan};
  for (int j = 1; j < L; ++j)
    if (bv[j] > r.best || (bv[j] == r.best && bi[j] < r.index)) r.best = bv[j], r.index = bi[j];
  return scan_from(r, p, i, n);
}

// Lane j of an accumulator holds the first index of the largest value it saw in that lane (strictly
// greater replaces), so among the lanes whose value is the row's max, the smallest index is the row's first
// argmax. Four accumulators over consecutive 16-value blocks keep four compare chains in flight; they are
// merged lane by lane with the same rule (larger value, or equal value and smaller index).
__attribute__((target("avx512f,avx512dq"))) ArgMax argmax_avx512(const float* p, int64_t n) {
  if (n < 64) return argmax_scalar(p, n);
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512 best[4];
  __m512i idx[4];
  __mmask16 nan = 0;
  for (int j = 0; j < 4; ++j) {
    best[j] = _mm512_loadu_ps(p + 16 * j);
    idx[j] = _mm512_add_epi32(lanes, _mm512_set1_epi32(16 * j));
    nan |= _mm512_cmp_ps_mask(best[j], best[j], _CMP_UNORD_Q);
  }
  int64_t i = 64;
  for (; i + 64 <= n; i += 64)
    for (int j = 0; j < 4; ++j) {
      const __m512 v = _mm512_loadu_ps(p + i + 16 * j);
      nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
      const __mmask16 gt = _mm512_cmp_ps_mask(v, best[j], _CMP_GT_OQ);
      best[j] = _mm512_mask_mov_ps(best[j], gt, v);
      idx[j] = _mm512_mask_mov_epi32(idx[j], gt, _mm512_add_epi32(lanes, _mm512_set1_epi32((int32_t)(i + 16 * j))));
    }
  for (int j = 1; j < 4; ++j) {
    const __mmask16 take = _mm512_cmp_ps_mask(best[j], best[0], _CMP_GT_OQ) |
                           (_mm512_cmp_ps_mask(best[j], best[0], _CMP_EQ_OQ) &
                            _mm512_cmplt_epi32_mask(idx[j], idx[0]));
    best[0] = _mm512_mask_mov_ps(best[0], take, best[j]);
    idx[0] = _mm512_mask_mov_epi32(idx[0], take, idx[j]);
  }
  for (; i + 16 <= n; i += 16) {  // later indices than any above: strictly greater keeps the earlier
    const __m512 v = _mm512_loadu_ps(p + i);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    const __mmask16 gt = _mm512_cmp_ps_mask(v, best[0], _CMP_GT_OQ);
    best[0] = _mm512_mask_mov_ps(best[0], gt, v);
    idx[0] = _mm512_mask_mov_epi32(idx[0], gt, _mm512_add_epi32(lanes, _mm512_set1_epi32((int32_t)i)));
  }
  alignas(64) float bv[16];
  alignas(64) int32_t bi[16];
  _mm512_store_ps(bv, best[0]);
  _mm512_store_si512(bi, idx[0]);
  return merge_lanes<16>(bv, bi, nan != 0, p, i, n);
}

__attribute__((target("avx2"))) ArgMax argmax_avx2(const float* p, int64_t n) {
  if (n < 8) return argmax_scalar(p, n);
  __m256 best = _mm256_loadu_ps(p);
  __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), cur = idx;
  const __m256i step = _mm256_set1_epi32(8);
  __m256 nan = _mm256_cmp_ps(best, best, _CMP_UNORD_Q);
  int64_t i = 8;
  for (; i + 8 <= n; i += 8) {
    cur = _mm256_add_epi32(cur, step);
    const __m256 v = _mm256_loadu_ps(p + i);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    const __m256 gt = _mm256_cmp_ps(v, best, _CMP_GT_OQ);
    best = _mm256_blendv_ps(best, v, gt);
    idx = _mm256_blendv_epi8(idx, cur, _mm256_castps_si256(gt));
  }
  alignas(32) float bv[8];
  alignas(32) int32_t bi[8];
  _mm256_store_ps(bv, best);
  _mm256_store_si256((__m256i*)bi, idx);
  return merge_lanes<8>(bv, bi, _mm256_movemask_ps(nan) != 0, p, i, n);
}

ArgMax argmax(const float* p, int64_t n, int isa) {
  return isa >= 2 ? argmax_avx512(p, n) : isa == 1 ? argmax_avx2(p, n) : argmax_scalar(p, n);
}

// Logits up to this many floats (16 MB: 85 rows of a 49152-token vocabulary) go to a buffer the calling
// thread keeps, so a decode step writes into memory that is already mapped and cached; more (a large batch
// over a large vocabulary) to one freed after the call, so the process does not hold it.
constexpr int64_t kKeptScratch = int64_t{1} << 22;

}  // namespace

float* fdk::logits_scratch(int64_t floats, std::vector<float>& once) {
  thread_local std::vector<float> kept;
  std::vector<float>& buf = floats <= kKeptScratch ? kept : once;
  if ((int64_t)buf.size() < floats) buf.resize(floats);
  return buf.data();
}

namespace {

// Thread t of nt's share of every row of c [m, n]: columns [n t / nt, n (t + 1) / nt), into part[r * nt + t]
// (index -1: an empty share).
void scan_share(const float* c, int64_t m, int64_t n, int t, int nt, int isa, ArgMax* part) {
  const int64_t lo = n * t / nt, hi = n * (t + 1) / nt;
  for (int64_t r = 0; r < m; ++r) {
    ArgMax a{0.0f, -1, false};
    if (hi > lo) {
      a = argmax(c + r * n + lo, hi - lo, isa);
      a.index += lo;
    }
    part[r * nt + t] = a;
  }
}

}  // namespace

// out[r] from the nt shares of row r, in column order: a tie keeps the earlier share's (lower) index.
void fdk::argmax_combine(const ArgMax* part, int64_t m, int nt, int64_t* out) {
  for (int64_t r = 0; r < m; ++r) {
    ArgMax best{0.0f, -1, false};
    bool nan = false;
    for (int u = 0; u < nt; ++u) {
      const ArgMax& a = part[r * nt + u];
      if (a.index < 0) continue;
      nan |= a.nan;
      if (best.index < 0 || a.best > best.best) best = a;
    }
    out[r] = nan ? -1 : best.index;
  }
}

void fdk::argmax_share(const float* c, int64_t m, int64_t n, int t, int nt, ArgMax* part) {
  scan_share(c, m, n, t, nt, fdk::active_isa(), part);
}

namespace {

// Logits below which the calling thread scans them alone (a decode step's few rows): a second parallel
// region, or a barrier inside the GEMM's, costs more than the scan, and much more when a thread of the team
// is descheduled on a busy machine.
constexpr int64_t kParallelScan = int64_t{1} << 18;

// fd_linear's gemm into c, then every row's argmax: by the calling thread alone, or over many rows by the
// team, each thread its share of the columns.
void gemm_argmax(const fdk::GemmArgs& g, int64_t* out) {
  fdk::gemm(g, nullptr);
  const int isa = fdk::active_isa();
  const int nth = g.m * g.n < kParallelScan ? 1 : std::max(1, std::min<int>(omp_get_max_threads(), (int)(g.n / 4096)));
  std::vector<ArgMax> part(g.m * nth);
  int used = 1;
#pragma omp parallel num_threads(nth) if (nth > 1)
  {
    const int nt = omp_get_num_threads();
#pragma omp single nowait
    used = nt;
    scan_share(g.c, g.m, g.n, omp_get_thread_num(), nt, isa, part.data());
  }
  fdk::argmax_combine(part.data(), g.m, used, out);
}

}  // namespace

void fdk::linear_argmax(fdk::GemmArgs g, int64_t* out) {
  std::vector<float> once;
  g.c = fdk::logits_scratch(g.m * g.n, once);
  gemm_argmax(g, out);
}

std::vector<Tensor> LinearArgmax(const Tensor& x_in, const Tensor& w, const Tensor& scales, const Tensor& mins,
                                 const Tensor& bias, int64_t n, int64_t kind, int64_t group, bool has_bias) {
  fdglue::check_f32(x_in, "x");
  const Tensor x = fdglue::contig(x_in);
  const int64_t k = x.shape().empty() ? 1 : x.shape().back();
  PD_CHECK(x.shape().size() == 2 && k > 0, "linear_argmax: x must be [rows, features]");
  PD_CHECK(n > 0, "linear_argmax: the weight has no outputs");
  const int64_t m = x.shape()[0];
  PD_CHECK(kind >= fdk::kF32 && kind <= fdk::kQ8_0, "linear_argmax: unknown weight kind ", kind);
  PD_CHECK(w.dtype() == fdglue::packed_dtype(kind) && w.is_contiguous(),
           "linear_argmax: packed weight has the wrong dtype for its kind");
  PD_CHECK(w.numel() == fdk::packed_elems((int)kind, n, k), "linear_argmax: x has ", k,
           " features but the packed weight does not match");
  Tensor out = paddle::empty({m}, paddle::DataType::INT64, x.place());
  if (m == 0) return {out};
  fdk::GemmArgs g{x.data<float>(), k, m, k, n, w.data(), scales.data<float>(), mins.data<float>(),
                  group, (int)kind, has_bias ? bias.data<float>() : nullptr, nullptr};
  fdk::linear_argmax(g, out.data<int64_t>());
  return {out};
}

PD_BUILD_OP(fd_linear_argmax)
    .Inputs({"X", "W", "Scales", "Mins", "Bias"})
    .Outputs({"Out"})
    .Attrs({"n: int64_t", "kind: int64_t", "group: int64_t", "has_bias: bool"})
    .SetKernelFn(PD_KERNEL(LinearArgmax));
