// ISA-generic kernels. kernels.cc includes this file once per ISA namespace, after defining FD_W (vector
// width in floats) and FD_MR (rows of the GEMM microkernel: as many as the register file holds with
// kNR / FD_W accumulators per row). No include guard on purpose.

#include "simd.h"
#include "vexp.h"

// ---------------------------------------------------------------------------------------------- GEMM
constexpr int kNV = kNR / FD_W;  // vectors per panel row

// Loads the kNR weights of row k of panel p as kNV vectors, dequantized with the group's scale/min
// (and rounded to bf16 when RND: the AMX level's numerics, see amx.cc).
template <int KIND, bool RND>
static inline void load_b(const GemmArgs& g, int64_t p, int64_t k, const vf* s, const vf* mn, vf* b) {
  if (KIND == kF32) {
    const float* bp = (const float*)g.w + (p * g.k + k) * kNR;
    for (int v = 0; v < kNV; ++v) b[v] = vload(bp + v * FD_W);
  } else if (KIND == kS8) {
    const int8_t* bp = (const int8_t*)g.w + (p * g.k + k) * kNR;
    for (int v = 0; v < kNV; ++v) b[v] = vmul(vload_s8(bp + v * FD_W), s[v]);
  } else {
    const uint8_t* bp = (const uint8_t*)g.w + (p * g.k + k) * (kNR / 2);
    for (int v = 0; v < kNV; ++v) {
      const int c = v * FD_W;  // first column of this vector
      b[v] = vfma(vload_u4(bp + (c % 16), c >= 16 ? 4 : 0), s[v], mn[v]);
    }
  }
#if FD_W == 16
  if (RND)
    for (int v = 0; v < kNV; ++v) b[v] = vround_bf16(b[v]);
#endif
}

// Rows x k of NP panels: acc[q][m] += A[m, k] * W[k, panel p + q], for k in [k, kend) of one scale group.
// Every output element is one FMA chain over k in order, whatever MR and NP are: a row's result never
// depends on how many rows share its GEMM (a decode step's batch, a recomputed prompt after preemption).
// Few rows take several panels at once instead (NP), so enough independent chains are in flight to hide
// the FMA latency without splitting any element's sum.
template <int MR, int NP, int KIND, bool RND>
static inline void micro_group(const GemmArgs& g, const float* a, int64_t p, int64_t k, int64_t kend,
                               const vf (*s)[kNV], const vf (*mn)[kNV], vf (*acc)[MR][kNV]) {
  vf b[kNV];
  for (; k < kend; ++k) {
    for (int q = 0; q < NP; ++q) {
      load_b<KIND, RND>(g, p + q, k, s[q], mn[q], b);
      for (int m = 0; m < MR; ++m) {
        const vf av = vset1(a[m * g.lda + k]);
        for (int v = 0; v < kNV; ++v) acc[q][m][v] = vfma(av, b[v], acc[q][m][v]);
      }
    }
  }
}

// The kNV scale (and, for kU4, min) vectors of panel p's scale group gi, of ngroups a panel.
template <int KIND>
static inline void load_scales(const GemmArgs& g, int64_t p, int64_t gi, int64_t ngroups, vf* s, vf* mn) {
  const int64_t off = (p * ngroups + gi) * kNR;
  for (int v = 0; v < kNV; ++v) {
    s[v] = vload(g.scales + off + v * FD_W);
    mn[v] = KIND == kU4 ? vload(g.mins + off + v * FD_W) : vzero();
  }
}

// K range [k0, k1) of panels p .. p+NP for rows m0 .. m0+MR: C = (first ? bias : C) + A x W. Accumulators
// stay in registers over the range; each weight row is dequantized once and reused by all MR rows.
// Resuming from C between K blocks continues each element's chain exactly (fp32 in, fp32 out).
template <int MR, int NP, int KIND, bool RND>
static void micro(const GemmArgs& g, int64_t m0, int64_t p, int64_t k0, int64_t k1, bool first) {
  vf acc[NP][MR][kNV];
  for (int q = 0; q < NP; ++q) {
    const int64_t n0 = (p + q) * kNR;
    const int64_t ncols = std::min<int64_t>(kNR, g.n - n0);
    for (int m = 0; m < MR; ++m) {
      const float* crow = g.c + (m0 + m) * g.n + n0;
      float tmp[kNR];
      if (!first && ncols != kNR) std::memcpy(tmp, crow, ncols * sizeof(float));
      for (int v = 0; v < kNV; ++v) {
        if (first)
          acc[q][m][v] = g.bias ? vload(g.bias + n0 + v * FD_W) : vzero();
        else
          acc[q][m][v] = ncols == kNR ? vload(crow + v * FD_W) : vload(tmp + v * FD_W);
      }
    }
  }
  const float* a = g.a + m0 * g.lda;
  const int64_t group = KIND == kF32 ? g.k : g.group;
  const int64_t ngroups = (g.k + group - 1) / group;
  vf s[NP][kNV], mn[NP][kNV];
  for (int64_t k = k0; k < k1;) {
    const int64_t gi = k / group;
    if (KIND != kF32)
      for (int q = 0; q < NP; ++q) load_scales<KIND>(g, p + q, gi, ngroups, s[q], mn[q]);
    const int64_t kend = std::min(k1, (gi + 1) * group);
    micro_group<MR, NP, KIND, RND>(g, a, p, k, kend, s, mn, acc);
    k = kend;
  }
  for (int q = 0; q < NP; ++q) {
    const int64_t n0 = (p + q) * kNR;
    const int64_t ncols = std::min<int64_t>(kNR, g.n - n0);
    for (int m = 0; m < MR; ++m) {
      float* crow = g.c + (m0 + m) * g.n + n0;
      float tmp[kNR];
      float* dst = ncols == kNR ? crow : tmp;
      for (int v = 0; v < kNV; ++v) vstore(dst + v * FD_W, acc[q][m][v]);
      if (ncols != kNR) std::memcpy(crow, tmp, ncols * sizeof(float));
    }
  }
}

#define FD_MICRO_CASE(n)                                            \
  case n:                                                           \
    if constexpr (n <= FD_MR) micro<n, 1, KIND, RND>(g, m0, p, k0, k1, first); \
    break;

template <int KIND, bool RND>
static void micro_rows(const GemmArgs& g, int mr, int64_t m0, int64_t p, int64_t k0, int64_t k1, bool first) {
  switch (mr) {
    FD_MICRO_CASE(1) FD_MICRO_CASE(2) FD_MICRO_CASE(3) FD_MICRO_CASE(4) FD_MICRO_CASE(5)
    FD_MICRO_CASE(6) FD_MICRO_CASE(7) FD_MICRO_CASE(8) FD_MICRO_CASE(9) FD_MICRO_CASE(10)
    FD_MICRO_CASE(11) FD_MICRO_CASE(12) FD_MICRO_CASE(13) FD_MICRO_CASE(14)
  }
}

// One or two rows (decode) over `np` panels from p: up to 4 (one row) or 2 (two rows) at a time, so as
// many chains run side by side as 4 x kNV per row. The numbers are those of micro_rows: only speed differs.
template <int KIND, bool RND>
static void micro_small(const GemmArgs& g, int mr, int64_t p, int64_t np, int64_t k0, int64_t k1, bool first) {
  int64_t q = 0;
  if (mr == 1) {
    for (; q + 4 <= np; q += 4) micro<1, 4, KIND, RND>(g, 0, p + q, k0, k1, first);
    for (; q + 2 <= np; q += 2) micro<1, 2, KIND, RND>(g, 0, p + q, k0, k1, first);
  } else {  // every ISA's FD_MR is at least 2
    for (; q + 2 <= np; q += 2) micro<2, 2, KIND, RND>(g, 0, p + q, k0, k1, first);
  }
  for (; q < np; ++q) micro_rows<KIND, RND>(g, mr, 0, p + q, k0, k1, first);
}

#if FD_W == 8
// Prompt rows on AVX2, where a weight row dequantized per use costs as much as its FMAs: each thread
// dequantizes a (K block, panel) of weights once into an fp32 scratch in the kF32 panel layout (load_b's
// values, so the same operands), and a register-blocked kernel runs every row of its chunk against it.
// The kernel holds up to kPR rows x 16 columns (12 accumulators, 2 weight vectors, 1 broadcast of the 16
// ymm registers) and takes each output's FMA chain over k in order from the bias, resuming from C between
// K blocks: the numbers of micro(), for any row count and chunking.
#ifndef FD_PACK_KC  // overridable for kernels/bench_native.cc experiments
#define FD_PACK_KC 768
#define FD_PACK_MC 256
#endif
constexpr int kPR = 6;
// Rows from which the scratch pays: below them dequantizing per use (micro_rows) costs no more than
// storing the block and loading it back.
constexpr int64_t kPackMinRows = 5;
constexpr int64_t kPKC = FD_PACK_KC;  // most k's per block: its dequantized panel (96 KiB) stays in L2
constexpr int64_t kPMC = FD_PACK_MC;  // most rows per chunk, the unit the threads split with the panels

// Rows [k0, k1) of panel p dequantized into out [k1 - k0][kNR].
template <int KIND>
static void unpack_panel(const GemmArgs& g, int64_t p, int64_t k0, int64_t k1, float* out) {
  const int64_t ngroups = (g.k + g.group - 1) / g.group;
  vf s[kNV], mn[kNV], b[kNV];
  for (int64_t k = k0; k < k1;) {
    const int64_t gi = k / g.group, kend = std::min(k1, (gi + 1) * g.group);
    load_scales<KIND>(g, p, gi, ngroups, s, mn);
    for (; k < kend; ++k, out += kNR) {
      load_b<KIND, false>(g, p, k, s, mn, b);
      for (int v = 0; v < kNV; ++v) vstore(out + v * FD_W, b[v]);
    }
  }
}

// R rows x 16 columns over kn >= 1 k's: c[m] = init[m] + sum over k of a[m, k] * b[k], each column one FMA
// chain in k order. b's rows are kNR floats apart, init's ldi apart (0: every row starts from the same bias).
template <int R>
static void micro_packed(const float* a, int64_t lda, const float* b, int64_t kn, const float* init, int64_t ldi,
                         float* c, int64_t ldc) {
  vf acc[R][2];
  for (int m = 0; m < R; ++m)
    for (int v = 0; v < 2; ++v) acc[m][v] = vload(init + m * ldi + v * FD_W);
  int64_t k = 0;
  do {  // kn >= 1: no path around the loop, so the accumulators stay in registers from load to store
    const vf b0 = vload(b), b1 = vload(b + FD_W);
    for (int m = 0; m < R; ++m) {
      const vf av = vset1(a[m * lda + k]);
      acc[m][0] = vfma(av, b0, acc[m][0]);
      acc[m][1] = vfma(av, b1, acc[m][1]);
    }
    b += kNR;
  } while (++k < kn);
  for (int m = 0; m < R; ++m)
    for (int v = 0; v < 2; ++v) vstore(c + m * ldc + v * FD_W, acc[m][v]);
}

// Rows m0 .. m0+r (r <= kPR), columns n0 .. n0+16 of C over [k0, k1), from the bias on the first K block and
// from C after it. A tile past column g.n runs on a copy, so the kernel never reads or writes past a row.
static void tile_packed(const GemmArgs& g, int r, int64_t m0, int64_t n0, const float* b, int64_t k0, int64_t k1,
                        bool first) {
  const float* a = g.a + m0 * g.lda + k0;
  const int64_t ncols = std::min<int64_t>(2 * FD_W, g.n - n0);
  float* c = g.c + m0 * g.n + n0;
  alignas(32) float tmp[kPR * 2 * FD_W];
  float* dst = c;
  int64_t ldc = g.n;
  if (ncols != 2 * FD_W) {
    if (!first)
      for (int m = 0; m < r; ++m) std::memcpy(tmp + m * 2 * FD_W, c + m * g.n, ncols * sizeof(float));
    dst = tmp;
    ldc = 2 * FD_W;
  }
  alignas(32) static const float zeros[2 * FD_W] = {};
  const float* init = first ? (g.bias ? g.bias + n0 : zeros) : dst;
  const int64_t ldi = first ? 0 : ldc, kn = k1 - k0;
  switch (r) {
    case 1: micro_packed<1>(a, g.lda, b, kn, init, ldi, dst, ldc); break;
    case 2: micro_packed<2>(a, g.lda, b, kn, init, ldi, dst, ldc); break;
    case 3: micro_packed<3>(a, g.lda, b, kn, init, ldi, dst, ldc); break;
    case 4: micro_packed<4>(a, g.lda, b, kn, init, ldi, dst, ldc); break;
    case 5: micro_packed<5>(a, g.lda, b, kn, init, ldi, dst, ldc); break;
    default: micro_packed<kPR>(a, g.lda, b, kn, init, ldi, dst, ldc); break;
  }
  if (dst != c)
    for (int m = 0; m < r; ++m) std::memcpy(c + m * g.n, tmp + m * 2 * FD_W, ncols * sizeof(float));
}

// Rows [r0, r1) of panel p over [k0, k1), in balanced blocks of at most kPR rows (BalancedBlocks).
static void rows_packed(const GemmArgs& g, int64_t r0, int64_t r1, int64_t p, const float* b, int64_t k0,
                        int64_t k1, bool first) {
  const BalancedBlocks blocks(r1 - r0, kPR);
  for (int64_t i = 0, m0 = r0; i < blocks.count; ++i) {
    const int r = (int)blocks.size(i);
    for (int64_t n0 = p * kNR; n0 < std::min(g.n, (p + 1) * kNR); n0 += 2 * FD_W)
      tile_packed(g, r, m0, n0, b + n0 % kNR, k0, k1, first);
    m0 += r;
  }
}

// Threads split the (panel, row chunk) pairs panel-major, as gemm_kind's blocked schedule does: a panel's
// weights are read from memory once per chunk. Each pair walks its K blocks with the panel's block
// dequantized once (kF32 panels are read in place).
template <int KIND>
static void gemm_packed(const GemmArgs& g) {
  const int64_t panels = (g.n + kNR - 1) / kNR;
  const int64_t nchunks = (g.m + kPMC - 1) / kPMC;
  const int64_t rows = (g.m + nchunks - 1) / nchunks;  // balanced chunks
  const int64_t nkb = (g.k + kPKC - 1) / kPKC;
  const int64_t kc = (g.k + nkb - 1) / nkb;  // balanced K blocks: 1000 -> 500 + 500
  const bool parallel = g.m * g.n * g.k >= (1 << 16) && panels * nchunks > 1;
#pragma omp parallel if (parallel)
  {
    const Scratch buf = scratch(KIND == kF32 ? 0 : kc * kNR);
#pragma omp for schedule(static) collapse(2)
    for (int64_t p = 0; p < panels; ++p) {
      for (int64_t c = 0; c < nchunks; ++c) {
        const int64_t r0 = c * rows, r1 = std::min(g.m, r0 + rows);
        for (int64_t k0 = 0; k0 < g.k; k0 += kc) {
          const int64_t k1 = std::min(g.k, k0 + kc);
          const float* b = (const float*)g.w + (p * g.k + k0) * kNR;
          if (KIND != kF32) {
            unpack_panel<KIND>(g, p, k0, k1, buf.get());
            b = buf.get();
          }
          rows_packed(g, r0, r1, p, b, k0, k1, k0 == 0);
        }
      }
    }
  }
}
#endif

// Rows at or above which K is blocked: then a kKC x kNR weight block (48 KiB fp32) stays in L1/L2 while
// every row block uses it, and the A[:, kc] block stays in L2 across a thread's panels. Below it (decode)
// the weights are streamed once from memory and K is not blocked.
#ifndef FD_GEMM_KC  // overridable for kernels/bench_native.cc experiments
#define FD_GEMM_KC 384
#define FD_GEMM_KC_MIN_ROWS 48
#endif
constexpr int64_t kKC = FD_GEMM_KC;
constexpr int64_t kBlockKMinRows = FD_GEMM_KC_MIN_ROWS;

// Threads split the (panel, row block) pairs, panel-major: with many panels each thread owns whole
// panels and walks all their row blocks (a panel is read from memory once, then reused from L2); with one
// or two panels (a classifier head) the row blocks are split instead. The static schedule gives each
// thread the same pairs in every K block, so no barrier is needed between K blocks.
template <int KIND, bool RND>
static void gemm_kind(const GemmArgs& g) {
#if FD_W == 8
  if (g.m >= kPackMinRows && g.k > 0 && !RND) return gemm_packed<KIND>(g);
#endif
  const int64_t panels = (g.n + kNR - 1) / kNR;
  const int64_t nblocks = (g.m + FD_MR - 1) / FD_MR;
  const int64_t rows = (g.m + nblocks - 1) / nblocks;  // balanced blocks: M=16 -> 8+8, not 12+4
  const int64_t kc = g.m >= kBlockKMinRows ? kKC : std::max<int64_t>(g.k, 1);
  const bool parallel = g.m * g.n * g.k >= (1 << 16) && panels * nblocks > 1;
  if (g.m <= 2) {
    // Decode: each thread one contiguous, even share of the panels, taken a few panels at a time.
#pragma omp parallel if (parallel)
    {
      const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
      const int64_t p0 = panels * t / nt, p1 = panels * (t + 1) / nt;
      micro_small<KIND, RND>(g, (int)g.m, p0, p1 - p0, 0, g.k, true);
    }
    return;
  }
#pragma omp parallel if (parallel)
  for (int64_t k0 = 0; k0 < g.k || k0 == 0; k0 += kc) {
    const int64_t k1 = std::min(g.k, k0 + kc);
#pragma omp for schedule(static) collapse(2) nowait
    for (int64_t p = 0; p < panels; ++p) {
      for (int64_t b = 0; b < nblocks; ++b)
        micro_rows<KIND, RND>(g, (int)std::min(rows, g.m - b * rows), b * rows, p, k0, k1, k0 == 0);
    }
  }
}

static void gemm(const GemmArgs& g) {
  if (g.kind == kF32)
    gemm_kind<kF32, false>(g);
#if FD_W == 16
  else if (g.bf16 && g.kind == kS8)
    gemm_kind<kS8, true>(g);
  else if (g.bf16)
    gemm_kind<kU4, true>(g);
#endif
  else if (g.kind == kS8)
    gemm_kind<kS8, false>(g);
  else
    gemm_kind<kU4, false>(g);
}

// ------------------------------------------------------------------------------------ elementwise
static inline float dot(const float* x, const float* y, int64_t n) {
  vf acc = vzero(), acc2 = vzero();  // two chains: half the FMA latency
  int64_t i = 0;
  for (; i + 2 * FD_W <= n; i += 2 * FD_W) {
    acc = vfma(vload(x + i), vload(y + i), acc);
    acc2 = vfma(vload(x + i + FD_W), vload(y + i + FD_W), acc2);
  }
  for (; i + FD_W <= n; i += FD_W) acc = vfma(vload(x + i), vload(y + i), acc);
  float s = vhsum(vadd(acc, acc2));
  for (; i < n; ++i) s += x[i] * y[i];
  return s;
}

static void norm_row(const float* x, const float* w, float eps, int64_t h, float* out) {
  const float inv = 1.0f / std::sqrt(dot(x, x, h) / (float)h + eps);
  const vf iv = vset1(inv);
  int64_t i = 0;
  for (; i + FD_W <= h; i += FD_W) vstore(out + i, vmul(vmul(vload(x + i), iv), vload(w + i)));
  for (; i < h; ++i) out[i] = x[i] * inv * w[i];
}

static void rms_norm(const float* x, const float* w, float eps, int64_t t, int64_t h, float* out) {
#pragma omp parallel for schedule(static) if (t * h >= (1 << 16))
  for (int64_t r = 0; r < t; ++r) norm_row(x + r * h, w, eps, h, out + r * h);
}

// One row of fused_add_rms_norm: sr = x + res, out = its norm. sr may be res (each element is read before
// it is written).
static inline void add_norm_row(const float* xr, const float* rr, const float* w, float eps, int64_t h, float* out,
                                float* sr) {
  int64_t i = 0;
  for (; i + FD_W <= h; i += FD_W) vstore(sr + i, vadd(vload(xr + i), vload(rr + i)));
  for (; i < h; ++i) sr[i] = xr[i] + rr[i];
  norm_row(sr, w, eps, h, out);
}

static void fused_add_rms_norm(const float* x, const float* res, const float* w, float eps, int64_t t,
                               int64_t h, float* out, float* res_out) {
#pragma omp parallel for schedule(static) if (t * h >= (1 << 16))
  for (int64_t r = 0; r < t; ++r) add_norm_row(x + r * h, res + r * h, w, eps, h, out + r * h, res_out + r * h);
}

// One row: o[i] = silu(gate[i]) * up[i]. o may be gate: each element is read before it is written.
static inline void silu_row(const float* gate, const float* up, int64_t n, float* o) {
  int64_t i = 0;
  for (; i + FD_W <= n; i += FD_W) vstore(o + i, vsilu_mul(vload(gate + i), vload(up + i)));
  for (; i < n; ++i) o[i] = silu_mul_tail(gate[i], up[i]);
}

static void silu_and_mul(const float* x, int64_t t, int64_t n, float* out) {
#pragma omp parallel for schedule(static) if (t * n >= (1 << 16))
  for (int64_t r = 0; r < t; ++r) silu_row(x + r * 2 * n, x + r * 2 * n + n, n, out + r * n);
}

// In place over the gate halves: no separate output array to bring into cache (decoder_stack.cc).
static void silu_and_mul_inplace(float* x, int64_t t, int64_t n) {
#pragma omp parallel for schedule(static) if (t * n >= (1 << 16))
  for (int64_t r = 0; r < t; ++r) silu_row(x + r * 2 * n, x + r * 2 * n + n, n, x + r * 2 * n);
}

static void exp2_nonpos(const float* x, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + FD_W <= n; i += FD_W) vstore(out + i, vexp2_nonpos(vload(x + i)));
#if FD_W > 1
  if (i < n) {  // the tail through a padded vector, so every element takes the vector formula
    alignas(64) float buf[FD_W > 1 ? FD_W : 1] = {};
    std::memcpy(buf, x + i, (n - i) * sizeof(float));
    vstore(buf, vexp2_nonpos(vload(buf)));
    std::memcpy(out + i, buf, (n - i) * sizeof(float));
  }
#endif
}

// NeoX rotary on one head: x[:half], x[half:] rotated by the angles of cos[:half], sin[:half], read from
// x and written to out (which may be x: each pair is read before it is written).
static inline void rope_head_to(const float* x, float* out, const float* cs, int64_t half) {
  const float *x1 = x, *x2 = x + half;
  float *o1 = out, *o2 = out + half;
  const float *c = cs, *s = cs + half;
  int64_t i = 0;
  for (; i + FD_W <= half; i += FD_W) {
    const vf a = vload(x1 + i), b = vload(x2 + i), cv = vload(c + i), sv = vload(s + i);
    vstore(o1 + i, vsub(vmul(a, cv), vmul(b, sv)));
    vstore(o2 + i, vfma(a, sv, vmul(b, cv)));
  }
  for (; i < half; ++i) {
    const float a = x1[i], b = x2[i];
    o1[i] = a * c[i] - b * s[i];
    o2[i] = b * c[i] + a * s[i];
  }
}

static inline void rope_head(float* x, const float* cs, int64_t half) { rope_head_to(x, x, cs, half); }

static void rotary_embedding(const int64_t* pos, float* q, float* k, const float* cos_sin, int64_t t,
                             int64_t nh, int64_t nkv, int64_t hd, int64_t q_stride, int64_t k_stride) {
#pragma omp parallel for schedule(static) if (t * (nh + nkv) * hd >= (1 << 16))
  for (int64_t r = 0; r < t; ++r) {
    const float* cs = cos_sin + pos[r] * hd;
    for (int64_t h = 0; h < nh; ++h) rope_head(q + r * q_stride + h * hd, cs, hd / 2);
    for (int64_t h = 0; h < nkv; ++h) rope_head(k + r * k_stride + h * hd, cs, hd / 2);
  }
}

// Calls put(src, row) for every token r and KV head h whose slot is not padding (slot < 0): src indexes
// the new K/V [T, nkv, hd] at (r, h), row the cache's (block, head, offset) rows [num_blocks, nkv, bs].
// Every cache dtype writes through it; a token's row depends on that token alone. Each token has its own
// slot, so a prefill-sized step (t * nkv * hd >= 2^16) splits the tokens over the threads.
template <class Put>
static inline void for_each_cache_row(const int64_t* slots, int64_t t, int64_t nkv, int64_t bs, int64_t hd,
                                      bool parallel, Put put) {
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t r = 0; r < t; ++r) {
    const int64_t slot = slots[r];
    if (slot < 0) continue;
    const int64_t blk = slot / bs, off = slot % bs;
    for (int64_t h = 0; h < nkv; ++h) put((r * nkv + h) * hd, (blk * nkv + h) * bs + off);
  }
}

static void reshape_and_cache(const float* k, const float* v, float* kc, float* vc, const int64_t* slots,
                              int64_t t, int64_t nkv, int64_t bs, int64_t hd) {
  for_each_cache_row(slots, t, nkv, bs, hd, t * nkv * hd >= (1 << 16), [&](int64_t src, int64_t row) {
    std::memcpy(kc + row * hd, k + src, hd * sizeof(float));
    std::memcpy(vc + row * hd, v + src, hd * sizeof(float));
  });
}

#include "attn_impl.h"

// ----------------------------------------------------------------------- decoder stack's QKV pass
// One head of the fused row rotated into dst (or RMS-normed into it with `norm`, then rotated in place):
// the values and operations of the separate split, norm and rotary passes.
static inline void head_to(const float* src, float* dst, const float* norm, float eps, const float* cs,
                           int64_t hd) {
  if (norm) {
    norm_row(src, norm, eps, hd, dst);
    rope_head(dst, cs, hd / 2);
  } else {
    rope_head_to(src, dst, cs, hd / 2);
  }
}

// Token r of qkv_rope_to_cache for KV heads [g0, g1) and their GQA groups' q heads: q heads into q; K
// through a per-head buffer into the cache, as reshape_and_cache* writes it, and V straight from the row.
// Each head's values depend on that head alone.
static inline void qkv_heads_to_cache(const QkvToCacheArgs& a, int64_t r, int64_t g0, int64_t g1, float* kbuf) {
  const int64_t hd = a.hd, group = a.nh / a.nkv;
  const float* row = a.qkv + r * (a.nh + 2 * a.nkv) * hd;
  const float* cs = a.cos_sin + a.pos[r] * hd;
  for (int64_t h = g0 * group; h < g1 * group; ++h)
    head_to(row + h * hd, a.q + (r * a.nh + h) * hd, a.q_norm, a.eps, cs, hd);
  const int64_t slot = a.slots[r];
  if (slot < 0) return;
  const int64_t blk = slot / a.bs, off = slot % a.bs;
  for (int64_t h = g0; h < g1; ++h) {
    const float* v = row + (a.nh + a.nkv + h) * hd;
    head_to(row + (a.nh + h) * hd, kbuf, a.k_norm, a.eps, cs, hd);
    const int64_t crow = (blk * a.nkv + h) * a.bs + off;
    if (a.kv_kind == kKvS8) {
      quantize_row_s8(kbuf, hd, (int8_t*)a.k_cache + crow * hd, a.k_scales + crow);
      quantize_row_s8(v, hd, (int8_t*)a.v_cache + crow * hd, a.v_scales + crow);
    } else if (a.kv_kind == kKvBF16) {
      round_row_bf16(kbuf, hd, (uint16_t*)a.k_cache + crow * hd);
      round_row_bf16(v, hd, (uint16_t*)a.v_cache + crow * hd);
    } else {
      std::memcpy((float*)a.k_cache + crow * hd, kbuf, hd * sizeof(float));
      std::memcpy((float*)a.v_cache + crow * hd, v, hd * sizeof(float));
    }
  }
}

static inline void qkv_row_to_cache(const QkvToCacheArgs& a, int64_t r, float* kbuf) {
  qkv_heads_to_cache(a, r, 0, a.nkv, kbuf);
}

// Tokens split over the threads for prefill-sized steps: each token has its own q rows and cache slot.
static void qkv_rope_to_cache(const QkvToCacheArgs& a) {
#pragma omp parallel if (a.t * (a.nh + 2 * a.nkv) * a.hd >= (1 << 16))
  {
    alignas(64) float kbuf[kMaxHeadDim];
#pragma omp for schedule(static)
    for (int64_t r = 0; r < a.t; ++r) qkv_row_to_cache(a, r, kbuf);
  }
}
