// The GGUF block GEMM's AVX2 (+FMA) microkernel, included by qgemm_impl.h inside isa_qavx2 (FD_QAVX2).
// No include guard: it belongs to that one namespace.
//
// Same integers as the VNNI path, another instruction: the activations stay 16-bit (Q itself, |Q| <=
// 32512, no hi/lo split) and vpmaddwd multiplies 16 codes (zero-extended to 16 bits, u <= 255) by 16 Q's
// and adds adjacent pairs into int32: each pair is at most 2 * 255 * 32512, the block's sum at most
// 32 * 255 * 32512, so every step is exact in int32 for every code and activation (vpmaddubsw's int16 pair
// sums would saturate on Q8_0's 8-bit codes). The fp32 steps per block are the VNNI path's, in its order
// (one fma of float(isum - z * sq) by d_w * da, then Q4_1's fma of m_w by s), so both paths give the same
// bits, and a row's result depends on that row alone.
//
// Codes arrive in vpdpbusd's order (kernels.h): per column 4 consecutive k's. vpshufb regroups each
// 128-bit lane (4 columns) into k pairs, and unpacking with zero widens them, giving one vector of 8
// columns x 2 k's as 16-bit lanes, so vpmaddwd against a broadcast (Q_k, Q_k+1) leaves one int32 per column.

constexpr int64_t kQPrefetch = 16;  // records ahead, as the VNNI path (docs/kernels-measurements.md)

// Rows m0 .. m0+MR against panels p0 .. p0+NP, all blocks. Per (row, panel): two int32 accumulators of 8
// columns for the block, two fp32 ones for the output.
template <int KIND, int MR, int NP>
static void qmicro(const GemmArgs& g, const QAct& x, int64_t m0, int64_t p0) {
  using K = QKind<KIND>;
  const int64_t nb = x.nb, rec = q_record_bytes(KIND);
  __m256 acc[MR][NP][2];
  for (int p = 0; p < NP; ++p)
    for (int h = 0; h < 2; ++h) {
      const __m256 b = g.bias ? _mm256_loadu_ps(g.bias + (p0 + p) * kQNR + 8 * h) : _mm256_setzero_ps();
      for (int r = 0; r < MR; ++r) acc[r][p][h] = b;
    }
  // Per 128-bit lane: (c, k0 k1) for c = 0..3, then (c, k2 k3).
  const __m256i pairs = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9,
                                         12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
  const __m256i zero = _mm256_setzero_si256(), low4 = _mm256_set1_epi16(15);
  for (int64_t blk = 0; blk < nb; ++blk) {
    const uint8_t* recs[NP];
    for (int p = 0; p < NP; ++p) recs[p] = (const uint8_t*)g.w + ((p0 + p) * nb + blk) * rec;
    for (int p = 0; p < NP; ++p)
      for (int64_t l = 0; l < rec; l += 64) _mm_prefetch((const char*)recs[p] + kQPrefetch * rec + l, _MM_HINT_T0);
    const int16_t* xb = x.q + m0 * x.k + blk * kQBlock;
    __m256i is[MR][NP][2];
    for (int r = 0; r < MR; ++r)
      for (int p = 0; p < NP; ++p) is[r][p][0] = is[r][p][1] = zero;
    // Quad j (k = 4j .. 4j+3) of every row against panel p's codes w: w[2h] holds columns 8h .. 8h+7 at
    // k = 4j, 4j+1 and w[2h+1] at 4j+2, 4j+3.
    auto quad = [&](int j, int p, const __m256i* w) {
      for (int r = 0; r < MR; ++r) {
        int32_t v01, v23;
        std::memcpy(&v01, xb + r * x.k + 4 * j, 4);
        std::memcpy(&v23, xb + r * x.k + 4 * j + 2, 4);
        const __m256i x01 = _mm256_set1_epi32(v01), x23 = _mm256_set1_epi32(v23);
        for (int h = 0; h < 2; ++h) {
          const __m256i s = _mm256_add_epi32(_mm256_madd_epi16(w[2 * h], x01), _mm256_madd_epi16(w[2 * h + 1], x23));
          is[r][p][h] = _mm256_add_epi32(is[r][p][h], s);
        }
      }
    };
    for (int c = 0; c < (K::kFour ? 4 : 8); ++c)
      for (int p = 0; p < NP; ++p) {
        __m256i u[4];  // bytes widened to 16 bits, in quad()'s order
        for (int h = 0; h < 2; ++h) {
          const __m256i raw = _mm256_shuffle_epi8(
              _mm256_loadu_si256((const __m256i*)(recs[p] + K::kCodes + 64 * c + 32 * h)), pairs);
          u[2 * h] = _mm256_unpacklo_epi8(raw, zero);
          u[2 * h + 1] = _mm256_unpackhi_epi8(raw, zero);
        }
        if (K::kFour) {  // chunk c: low nibbles are quad 2c, high nibbles quad 2c + 1
          __m256i w[4];
          for (int i = 0; i < 4; ++i) w[i] = _mm256_and_si256(u[i], low4);
          quad(2 * c, p, w);
          for (int i = 0; i < 4; ++i) w[i] = _mm256_srli_epi16(u[i], 4);
          quad(2 * c + 1, p, w);
        } else {
          quad(c, p, u);
        }
      }
    for (int p = 0; p < NP; ++p)
      for (int h = 0; h < 2; ++h) {
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(recs[p] + 16 * h)));
        const __m256 mw = K::kMin ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(recs[p] + 32 + 16 * h)))
                                  : _mm256_setzero_ps();
        for (int r = 0; r < MR; ++r) {
          const int64_t i = (m0 + r) * nb + blk;
          __m256i s = is[r][p][h];
          if (K::kZ) s = _mm256_sub_epi32(s, _mm256_set1_epi32(K::kZ * x.sq[i]));
          const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(x.d[i]));
          acc[r][p][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale, acc[r][p][h]);
          if (K::kMin) acc[r][p][h] = _mm256_fmadd_ps(mw, _mm256_set1_ps(x.s[i]), acc[r][p][h]);
        }
      }
  }
  for (int p = 0; p < NP; ++p) {
    const int64_t c0 = (p0 + p) * kQNR, cols = std::min<int64_t>(kQNR, g.n - c0);
    for (int r = 0; r < MR; ++r) {
      float* out = g.c + (m0 + r) * g.n + c0;
      if (cols == kQNR) {
        _mm256_storeu_ps(out, acc[r][p][0]);
        _mm256_storeu_ps(out + 8, acc[r][p][1]);
      } else {  // the last panel of an n that is not a multiple of 16
        float tmp[kQNR];
        _mm256_storeu_ps(tmp, acc[r][p][0]);
        _mm256_storeu_ps(tmp + 8, acc[r][p][1]);
        std::memcpy(out, tmp, cols * sizeof(float));
      }
    }
  }
}

#define FD_QMICRO_CASE(mr, np)                   \
  case (mr) * 4 + (np):                          \
    return qmicro<KIND, mr, np>(g, x, m0, p0);

#include "qgemm_avx2_row.h"

template <int KIND>
static void qitem(const GemmArgs& g, const QAct& x, int64_t m0, int mr, int64_t p0, int np) {
  if constexpr (KIND != kQ8_0)  // one-row calls: quantize_rows_local splits their row into x.hi / x.lo
    if (g.m == 1 && np == 1) return qrow<KIND, 1>(g, x, m0, p0);
  switch (mr * 4 + np) {
    FD_QMICRO_CASE(1, 1) FD_QMICRO_CASE(1, 2) FD_QMICRO_CASE(1, 3)
    FD_QMICRO_CASE(2, 1) FD_QMICRO_CASE(3, 1) FD_QMICRO_CASE(4, 1)
  }
}
#undef FD_QMICRO_CASE

// Registers: MR * NP * 2 int32 accumulators + 4 code vectors + 2 broadcasts fit the 16 ymm for these
// shapes; one panel per item from 2 rows on, so a panel's codes are unpacked once for up to 4 rows.
constexpr int kQMaxRows = 4;
constexpr int kQPanelsRows = 1;
// Panels per item for one row: one for the 4-bit kinds (qrow<KIND, 1>: a thread's run is one linear
// stream), three for Q8_0, whose qmicro needs the three panels' chains (docs/kernels-measurements.md).
constexpr int q_panels_one_row(int kind) { return kind == kQ8_0 ? 3 : 1; }
