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

// Half a panel's fp32 scales of one record: d_w of columns 8h .. 8h+7 and, Q4_1 only, m_w (else zeros).
template <int KIND>
static inline void half_scales(const uint8_t* rec, int h, __m256& dw, __m256& mw) {
  dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(rec + 16 * h)));
  mw = QKind<KIND>::kMin ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(rec + 32 + 16 * h))) : _mm256_setzero_ps();
}

// One block's fp32 steps for 8 columns of row block i (x's index blk * m + row), the VNNI path's in its order:
// acc + float(isum - z * sq) * (d_w * da), then, Q4_1 only, + m_w * s.
template <int KIND>
static inline __m256 scale_block(__m256 acc, __m256i isum, __m256 dw, __m256 mw, const QAct& x, int64_t i) {
  using K = QKind<KIND>;
  if (K::kZ) isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(K::kZ * x.sq[i]));
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, _mm256_set1_ps(x.d[i])), acc);
  if (K::kMin) acc = _mm256_fmadd_ps(mw, _mm256_set1_ps(x.s[i]), acc);
  return acc;
}

// A chunk of 64 code bytes widened to 16 bits: u[2h] holds columns 8h .. 8h+7 at the chunk's k's 0, 1 (of
// each column's 4 consecutive ones) and u[2h+1] at k's 2, 3.
static inline void widen_chunk(const uint8_t* chunk, __m256i u[4]) {
  // Per 128-bit lane: (c, k0 k1) for c = 0..3, then (c, k2 k3).
  const __m256i pairs = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9,
                                         12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
  for (int h = 0; h < 2; ++h) {
    const __m256i raw = _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i*)(chunk + 32 * h)), pairs);
    u[2 * h] = _mm256_unpacklo_epi8(raw, _mm256_setzero_si256());
    u[2 * h + 1] = _mm256_unpackhi_epi8(raw, _mm256_setzero_si256());
  }
}

// Calls f(j, p, w) for every quad j (k = 4j .. 4j+3) of the records' codes codes[p], p < NP, w[2h] holding
// columns 8h .. 8h+7 at k = 4j, 4j+1 and w[2h+1] at 4j+2, 4j+3, as 16-bit lanes (column, k pair).
template <int KIND, int NP, class F>
static inline void for_quads(const uint8_t* const* codes, F f) {
  const __m256i low4 = _mm256_set1_epi16(15);
  for (int c = 0; c < (QKind<KIND>::kFour ? 4 : 8); ++c)
    for (int p = 0; p < NP; ++p) {
      __m256i u[4];
      widen_chunk(codes[p] + 64 * c, u);
      if (QKind<KIND>::kFour) {  // chunk c: low nibbles are quad 2c, high nibbles quad 2c + 1
        __m256i w[4];
        for (int i = 0; i < 4; ++i) w[i] = _mm256_and_si256(u[i], low4);
        f(2 * c, p, w);
        for (int i = 0; i < 4; ++i) w[i] = _mm256_srli_epi16(u[i], 4);
        f(2 * c + 1, p, w);
      } else {
        f(c, p, u);
      }
    }
}

// One row against panels ps[0 .. NP), all blocks (decode's one row of Q8_0; the 4-bit kinds take
// qgemm_avx2_row.h's qrow_planes). Per panel: two int32 accumulators of 8 columns for the block, two fp32
// ones for the output.
template <int KIND, int NP>
static void qrow(const GemmArgs& g, const QAct& x, int64_t m0, const int64_t* ps) {
  using K = QKind<KIND>;
  const int64_t nb = x.nb, rec = q_record_bytes(KIND);
  __m256 acc[NP][2];
  for (int p = 0; p < NP; ++p)
    for (int h = 0; h < 2; ++h)
      acc[p][h] = g.bias ? _mm256_loadu_ps(g.bias + ps[p] * kQNR + 8 * h) : _mm256_setzero_ps();
  for (int64_t blk = 0; blk < nb; ++blk) {
    const uint8_t *recs[NP], *codes[NP];
    for (int p = 0; p < NP; ++p) {
      recs[p] = (const uint8_t*)g.w + (ps[p] * nb + blk) * rec;
      codes[p] = recs[p] + K::kCodes;
    }
    for (int p = 0; p < NP; ++p)
      for (int64_t l = 0; l < rec; l += 64) _mm_prefetch((const char*)recs[p] + kQPrefetch * rec + l, _MM_HINT_T0);
    const int16_t* xb = x.q + (blk * x.m + m0) * kQBlock;
    __m256i is[NP][2];
    for (int p = 0; p < NP; ++p) is[p][0] = is[p][1] = _mm256_setzero_si256();
    for_quads<KIND, NP>(codes, [&](int j, int p, const __m256i* w) {
      int32_t v01, v23;
      std::memcpy(&v01, xb + 4 * j, 4);
      std::memcpy(&v23, xb + 4 * j + 2, 4);
      const __m256i x01 = _mm256_set1_epi32(v01), x23 = _mm256_set1_epi32(v23);
      for (int h = 0; h < 2; ++h) {
        const __m256i s = _mm256_add_epi32(_mm256_madd_epi16(w[2 * h], x01), _mm256_madd_epi16(w[2 * h + 1], x23));
        is[p][h] = _mm256_add_epi32(is[p][h], s);
      }
    });
    const int64_t i = blk * x.m + m0;
    for (int p = 0; p < NP; ++p)
      for (int h = 0; h < 2; ++h) {
        __m256 dw, mw;
        half_scales<KIND>(recs[p], h, dw, mw);
        acc[p][h] = scale_block<KIND>(acc[p][h], is[p][h], dw, mw, x, i);
      }
  }
  for (int p = 0; p < NP; ++p) {
    const int64_t c0 = ps[p] * kQNR, cols = std::min<int64_t>(kQNR, g.n - c0);
    float tmp[kQNR];
    _mm256_storeu_ps(tmp, acc[p][0]);
    _mm256_storeu_ps(tmp + 8, acc[p][1]);
    std::memcpy(g.c + m0 * g.n + c0, tmp, cols * sizeof(float));
  }
}

// Rows r0 .. r0+MR of block blk against one panel's codes widened to w16 (int16 [k pair][column][2]), the
// int32 sums scaled into the rows' fp32 outputs out[r][0 .. 16). Codes come from L1 as loads, so the
// registers hold only the 2 * MR accumulators, the two code vectors of a k pair and a broadcast.
template <int KIND, int MR>
__attribute__((always_inline)) static inline void qblock_rows(const QAct& x, int64_t blk, int64_t r0,
                                                              const int16_t* w16, const __m256* dw,
                                                              const __m256* mw, float* out) {
  using K = QKind<KIND>;
  const int16_t* xb = x.q + (blk * x.m + r0) * kQBlock;  // the rows' Q, kQBlock apart
  __m256i is[MR][2];
  for (int r = 0; r < MR; ++r) is[r][0] = is[r][1] = _mm256_setzero_si256();
#pragma GCC unroll 16
  for (int j = 0; j < kQBlock / 2; ++j) {
    const __m256i c0 = _mm256_load_si256((const __m256i*)(w16 + 32 * j));
    const __m256i c1 = _mm256_load_si256((const __m256i*)(w16 + 32 * j + 16));
    for (int r = 0; r < MR; ++r) {
      int32_t v;
      std::memcpy(&v, xb + r * kQBlock + 2 * j, 4);
      const __m256i b = _mm256_set1_epi32(v);
      is[r][0] = _mm256_add_epi32(is[r][0], _mm256_madd_epi16(c0, b));
      is[r][1] = _mm256_add_epi32(is[r][1], _mm256_madd_epi16(c1, b));
    }
    // Keeps each k pair's products added as they come: unrolled without it, GCC re-associates the sums
    // into all-products-first trees and spills them.
    for (int r = 0; r < MR; ++r) asm("" : "+x"(is[r][0]), "+x"(is[r][1]));
  }
  // scale_block's steps, on the rows' outputs in L1; the rows' factors are adjacent (block-major).
  const int64_t i0 = blk * x.m + r0;
  const float *d = x.d + i0, *sm = x.s + i0;
  const int32_t* sq = x.sq + i0;
  for (int r = 0; r < MR; ++r)
    for (int h = 0; h < 2; ++h) {
      __m256i s = is[r][h];
      if (K::kZ) s = _mm256_sub_epi32(s, _mm256_set1_epi32(K::kZ * sq[r]));
      float* o = out + r * kQNR + 8 * h;
      __m256 acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw[h], _mm256_set1_ps(d[r])),
                                   _mm256_load_ps(o));
      if (K::kMin) acc = _mm256_fmadd_ps(mw[h], _mm256_set1_ps(sm[r]), acc);
      _mm256_store_ps(o, acc);
    }
}

// Rows per qblock_rows call, and rows per item (a row chunk): the chunk's running outputs (kQChunkRows x
// 16 fp32) and one block's widened codes stay in L1, and its activations (2 * k bytes a row) in L2 while
// the thread walks the panels. Six rows are the most whose 12 accumulators, the k pair's two code vectors
// and a broadcast fit AVX2's 16 vector registers; each row block reloads the codes from L1, so fewer,
// larger blocks take fewer loads and loop steps per multiply (a 16-row decode batch: 6 + 5 + 5, not 4 x 4).
constexpr int kQMaxRows = 6;  // qblock_chunk's switch covers 1 .. kQMaxRows
constexpr int64_t kQChunkRows = 128;

// Rows m0 .. m0+rows of block blk (qblock_rows's arguments), in balanced row blocks of at most kQMaxRows
// (BalancedBlocks: 7 rows -> 4 + 3), as a 1-row block's two accumulator chains are latency-bound. One call
// per block, so the row blocks run back to back without a call between them.
template <int KIND>
__attribute__((noinline)) static void qblock_chunk(const QAct& x, int64_t blk, int64_t m0, int64_t rows,
                                                   const int16_t* w16, const __m256* dw, const __m256* mw,
                                                   float* out) {
  const BalancedBlocks blocks(rows, kQMaxRows);
  for (int64_t b = 0, r = 0; b < blocks.count; ++b) {
    const int64_t n = blocks.size(b);
    if (n == 6) {
      qblock_rows<KIND, 6>(x, blk, m0 + r, w16, dw, mw, out + r * kQNR);
    } else if (n == 5) {
      qblock_rows<KIND, 5>(x, blk, m0 + r, w16, dw, mw, out + r * kQNR);
    } else if (n == 4) {
      qblock_rows<KIND, 4>(x, blk, m0 + r, w16, dw, mw, out + r * kQNR);
    } else if (n == 3) {
      qblock_rows<KIND, 3>(x, blk, m0 + r, w16, dw, mw, out + r * kQNR);
    } else if (n == 2) {
      qblock_rows<KIND, 2>(x, blk, m0 + r, w16, dw, mw, out + r * kQNR);
    } else {
      qblock_rows<KIND, 1>(x, blk, m0 + r, w16, dw, mw, out + r * kQNR);
    }
    r += n;
  }
}

// Rows m0 .. m1 (at most kQChunkRows) against panel p, all blocks, for more than one row: block by block,
// each block's codes widened once into w16 and multiplied by every row of the chunk, the rows' fp32
// outputs kept in out. Each output element gets qrow's integers and fp32 steps, in its order.
template <int KIND>
static void qpanel_rows(const GemmArgs& g, const QAct& x, int64_t m0, int64_t m1, int64_t p) {
  using K = QKind<KIND>;
  const int64_t nb = x.nb, rec = q_record_bytes(KIND), rows = m1 - m0;
  alignas(32) int16_t w16[kQBlock * kQNR];
  alignas(32) float out[kQChunkRows * kQNR];
  for (int64_t r = 0; r < rows; ++r)
    for (int c = 0; c < kQNR; ++c) out[r * kQNR + c] = g.bias ? g.bias[p * kQNR + c] : 0.0f;
  for (int64_t blk = 0; blk < nb; ++blk) {
    const uint8_t* rp = (const uint8_t*)g.w + (p * nb + blk) * rec;
    for (int64_t l = 0; l < rec; l += 64) _mm_prefetch((const char*)rp + kQPrefetch * rec + l, _MM_HINT_T0);
    const uint8_t* codes = rp + K::kCodes;
    for_quads<KIND, 1>(&codes, [&](int j, int, const __m256i* w) {
      for (int i = 0; i < 2; ++i)
        for (int h = 0; h < 2; ++h) _mm256_store_si256((__m256i*)(w16 + (2 * j + i) * 32 + 16 * h), w[2 * h + i]);
    });
    __m256 dw[2], mw[2];
    for (int h = 0; h < 2; ++h) half_scales<KIND>(rp, h, dw[h], mw[h]);
    qblock_chunk<KIND>(x, blk, m0, rows, w16, dw, mw, out);
  }
  const int64_t c0 = p * kQNR, cols = std::min<int64_t>(kQNR, g.n - c0);
  float* c = g.c + m0 * g.n + c0;
  if (cols == kQNR) {  // a full panel: two vector stores a row rather than a memcpy call
    for (int64_t r = 0; r < rows; ++r)
      for (int h = 0; h < 2; ++h) _mm256_storeu_ps(c + r * g.n + 8 * h, _mm256_load_ps(out + r * kQNR + 8 * h));
  } else {
    for (int64_t r = 0; r < rows; ++r) std::memcpy(c + r * g.n, out + r * kQNR, cols * sizeof(float));
  }
}

#include "qgemm_avx2_row.h"

// One row against panels ps[0 .. NP): the 4-bit kinds take qrow_planes, Q8_0 qrow.
template <int KIND, int NP>
static void qrow_panels(const GemmArgs& g, const QAct& x, int64_t m0, const int64_t* ps) {
  if constexpr (KIND != kQ8_0) {
    qrow_planes<KIND, NP>(g, x, m0, ps);
  } else {
    qrow<KIND, NP>(g, x, m0, ps);
  }
}

// One row, one panel (two panels far apart: qitem_pair). More rows go to qpanel_rows (run_items), never here.
template <int KIND>
static void qitem(const GemmArgs& g, const QAct& x, int64_t m0, int mr, int64_t p0, int np) {
  (void)mr;
  (void)np;  // q_panels_one_row: 1
  qrow_panels<KIND, 1>(g, x, m0, &p0);
}

constexpr int kQPanelsRows = 1;
// One row: an item is one panel, or (q_split's pairs) two panels half the matrix apart, so each thread
// reads two streams at once, which the hardware prefetchers keep further ahead than one; Q8_0's qrow then
// has the two panels' chains (docs/kernels-measurements.md).
constexpr int q_panels_one_row(int) { return 1; }
constexpr bool q_pairs_one_row(int) { return true; }
template <int KIND>
static void qitem_pair(const GemmArgs& g, const QAct& x, int64_t m0, int64_t pa, int64_t pb) {
  const int64_t ps[2] = {pa, pb};
  qrow_panels<KIND, 2>(g, x, m0, ps);
}
