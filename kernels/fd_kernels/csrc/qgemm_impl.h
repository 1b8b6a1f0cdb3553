// GEMM on GGUF block weights (kQ4_0, kQ4_1, kQ8_0; layout in kernels.h) with 16-bit fixed-point
// activations. Included once per ISA namespace by qgemm.cc with FD_QVNNI = 1 (AVX-512 VNNI: vpdpbusd
// multiplies 64 unsigned codes by 64 signed bytes of each of two int8 planes per instruction), FD_QAVX2 = 1
// (AVX2: vpmaddwd on the 16-bit activations themselves, qgemm_avx2.h) or neither (portable C++, the scalar
// baseline). No include guard.
//
// Every row, every block of 32 k's, in fp32: amax = max|x|, d = amax / 127, t = x * (1 / d) (0 when
// amax is 0), Q = rint(256 * t), an integer in [-32512, 32512]; da = d / 256 (exact), sq = sum(Q),
// s = da * sq. So x ~= da * Q within da / 2 (+ the rounding of t): 2^-15 of the block's largest value,
// against 2^-8 for llama.cpp's 8-bit Q8 activations, while the products still run on int8 units:
// Q = 256 * hi + lo with hi, lo signed bytes, and sum(u * Q) = 256 * sum(u * hi) + sum(u * lo), exact in
// int32 (|sum| <= 32 * 255 * 32512). The row's output accumulates in fp32, block by block:
//   acc += float(isum - z * sq) * (d_w * da)      then, Q4_1 only,   acc += m_w * s
// So a row's result depends on that row alone (never on its batch), and every ISA path computes the same
// integers; only how the compiler contracts the fp32 multiply-adds may differ between them.

struct QAct {
  const int8_t* hi;   // [m, k]: Q = 256 * hi + lo (VNNI and portable paths)
  const int8_t* lo;   // [m, k]
  const int16_t* q;   // [nb, m, kQBlock]: Q (AVX2 path), block-major: a block's rows are consecutive
  const float* d;     // [m, nb]: da (AVX2 path: [nb, m], block-major as q)
  const float* s;     // [m, nb]: da * sq (AVX2 path: [nb, m])
  const int32_t* sq;  // [m, nb] (AVX2 path: [nb, m])
  int64_t k, nb, m;
};

template <int KIND>
struct QKind {
  static constexpr bool kFour = KIND != kQ8_0;
  static constexpr bool kMin = KIND == kQ4_1;
  static constexpr int32_t kZ = q_zero(KIND);
  static constexpr int64_t kCodes = q_codes_offset(KIND);  // offset of the codes in a record
};

// fp16 bits -> fp32, exactly (what vcvtph2ps computes).
static inline float half_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 31, man = h & 1023, bits;
  if (exp == 31) {
    bits = sign | 0x7F800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    exp = 113;
    while (!(man & 1024)) {
      man <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((man & 1023) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// The code of column c, input j of a record's codes (layout in kernels.h).
static inline uint8_t q_code(const uint8_t* codes, bool four, int c, int j) {
  if (!four) return codes[64 * (j / 4) + 4 * c + j % 4];
  const uint8_t byte = codes[64 * (j / 8) + 4 * c + j % 4];
  return (j % 8) < 4 ? byte & 15 : byte >> 4;
}

// Writes Q as hi / lo, or as q on the AVX2 path (the other pointers are unused there).
static void quantize_block(const float* x, int8_t* hi, int8_t* lo, int16_t* q16, float* d_out, float* s_out,
                           int32_t* sq_out) {
#if FD_QVNNI
  const __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
  const float d = amax / 127.0f, id = amax != 0.0f ? 1.0f / d : 0.0f;
  const __m512 vid = _mm512_set1_ps(id), v256 = _mm512_set1_ps(256.0f);
  __m512i qsum = _mm512_setzero_si512();
  for (int h = 0; h < 2; ++h) {
    const __m512 t = _mm512_mul_ps(h ? b : a, vid);
    const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(t, v256));  // ties to even, as numpy's rint
    const __m512i l = _mm512_srai_epi32(_mm512_slli_epi32(q, 24), 24);
    _mm_storeu_si128((__m128i*)(lo + 16 * h), _mm512_cvtepi32_epi8(l));
    _mm_storeu_si128((__m128i*)(hi + 16 * h), _mm512_cvtepi32_epi8(_mm512_srai_epi32(_mm512_sub_epi32(q, l), 8)));
    qsum = _mm512_add_epi32(qsum, q);
  }
  const int32_t sq = _mm512_reduce_add_epi32(qsum);
#elif FD_QAVX2
  __m256 v[4], m = _mm256_setzero_ps();
  const __m256 nz = _mm256_set1_ps(-0.0f);
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(x + 8 * i);
    m = _mm256_max_ps(m, _mm256_andnot_ps(nz, v[i]));
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
  const float d = amax / 127.0f, id = amax != 0.0f ? 1.0f / d : 0.0f;
  const __m256 vid = _mm256_set1_ps(id), v256 = _mm256_set1_ps(256.0f);
  __m256i q[4], qsum = _mm256_setzero_si256();
  for (int i = 0; i < 4; ++i) {
    q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(v[i], vid), v256));  // ties to even, as numpy's rint
    qsum = _mm256_add_epi32(qsum, q[i]);
  }
  // |Q| <= 32512 fits int16, so the saturating pack is exact; it interleaves 128-bit lanes, undone by the
  // permute.
  for (int i = 0; i < 2; ++i)
    _mm256_storeu_si256((__m256i*)(q16 + 16 * i),
                        _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2 * i], q[2 * i + 1]), 0xD8));
  __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(qsum), _mm256_extracti128_si256(qsum, 1));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
  const int32_t sq = _mm_cvtsi128_si32(_mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1)));
  (void)hi;
  (void)lo;
#else
  float amax = 0.0f;
  for (int j = 0; j < kQBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f, id = amax != 0.0f ? 1.0f / d : 0.0f;
  int32_t sq = 0;
  for (int j = 0; j < kQBlock; ++j) {
    const float t = x[j] * id;
    const int32_t q = (int32_t)std::nearbyint(t * 256.0f);  // ties to even, as cvtps2dq and numpy's rint
    lo[j] = (int8_t)(uint8_t)(q & 255);
    hi[j] = (int8_t)((q - lo[j]) / 256);
    sq += q;
  }
  (void)q16;
#endif
  const float da = d * (1.0f / 256.0f);
  *d_out = da;
  *sq_out = sq;
  *s_out = da * (float)sq;
}

#if FD_QVNNI
// Lane j of the result: v[j]'s 16 lanes combined by op, in an order quantize_block16 undoes: a transposing
// tree of 15 ops, where 16 separate reductions take 16 dependent chains of 4 shuffles and ops each.
template <class Op>
static inline __m512 reduce16(__m512* v, Op op) {
  for (int j = 0; j < 8; ++j)
    v[j] = op(_mm512_shuffle_f32x4(v[j], v[j + 8], 0x44), _mm512_shuffle_f32x4(v[j], v[j + 8], 0xEE));
  for (int j = 0; j < 4; ++j)
    v[j] = op(_mm512_shuffle_f32x4(v[j], v[j + 4], 0x88), _mm512_shuffle_f32x4(v[j], v[j + 4], 0xDD));
  for (int j = 0; j < 2; ++j)
    v[j] = op(_mm512_shuffle_ps(v[j], v[j + 2], 0x44), _mm512_shuffle_ps(v[j], v[j + 2], 0xEE));
  return op(_mm512_shuffle_ps(v[0], v[1], 0x88), _mm512_shuffle_ps(v[0], v[1], 0xDD));
}

// quantize_block of 16 consecutive blocks, with the same integers and factors: the per-block maxima and
// sums by reduce16 (a maximum of absolute values and an int32 sum are the same in any order; only a NaN
// input, whose row is NaN anyway, could tell), the divisions and scale products in vector lanes (each
// lane's IEEE operation is the scalar one).
static void quantize_block16(const float* x, int8_t* hi, int8_t* lo, float* d_out, float* s_out, int32_t* sq_out) {
  // Lane j: the lane of reduce16's result that holds block j.
  const __m512i order = _mm512_setr_epi32(0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15);
  const auto vmax = [](__m512 a, __m512 b) { return _mm512_max_ps(a, b); };
  const auto vadd_i32 = [](__m512 a, __m512 b) {
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)));
  };
  __m512 v[16];
  for (int j = 0; j < 16; ++j)
    v[j] = vmax(_mm512_abs_ps(_mm512_loadu_ps(x + 32 * j)), _mm512_abs_ps(_mm512_loadu_ps(x + 32 * j + 16)));
  const __m512 amax = _mm512_permutexvar_ps(order, reduce16(v, vmax));
  const __m512 d = _mm512_div_ps(amax, _mm512_set1_ps(127.0f));
  const __mmask16 nz = _mm512_cmp_ps_mask(amax, _mm512_setzero_ps(), _CMP_NEQ_UQ);
  alignas(64) float ids[16];
  _mm512_store_ps(ids, _mm512_maskz_div_ps(nz, _mm512_set1_ps(1.0f), d));
  const __m512 v256 = _mm512_set1_ps(256.0f);
  for (int j = 0; j < 16; ++j) {
    const __m512 vid = _mm512_set1_ps(ids[j]);
    __m512i qsum = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
      const __m512 t = _mm512_mul_ps(_mm512_loadu_ps(x + 32 * j + 16 * h), vid);
      const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(t, v256));
      const __m512i l = _mm512_srai_epi32(_mm512_slli_epi32(q, 24), 24);
      _mm_storeu_si128((__m128i*)(lo + 32 * j + 16 * h), _mm512_cvtepi32_epi8(l));
      _mm_storeu_si128((__m128i*)(hi + 32 * j + 16 * h),
                       _mm512_cvtepi32_epi8(_mm512_srai_epi32(_mm512_sub_epi32(q, l), 8)));
      qsum = _mm512_add_epi32(qsum, q);
    }
    v[j] = _mm512_castsi512_ps(qsum);
  }
  const __m512i sq = _mm512_permutexvar_epi32(order, _mm512_castps_si512(reduce16(v, vadd_i32)));
  const __m512 da = _mm512_mul_ps(d, _mm512_set1_ps(1.0f / 256.0f));
  _mm512_storeu_ps(d_out, da);
  _mm512_storeu_si512(sq_out, sq);
  _mm512_storeu_ps(s_out, _mm512_mul_ps(da, _mm512_cvtepi32_ps(sq)));
}
#endif

// Row r of a [m, lda] into the QAct buffers (k % kQBlock == 0); q16 (the AVX2 path's Q) is block-major,
// [nb][m][kQBlock], and so are the AVX2 path's d, s and sq ([nb][m]: a row block's factors are adjacent).
static void quantize_row(const float* a, int64_t lda, int64_t r, int64_t m, int64_t k, int8_t* hi, int8_t* lo,
                         int16_t* q16, float* d, float* s, int32_t* sq) {
  const int64_t nb = k / kQBlock;
  int64_t b = 0;
#if FD_QVNNI
  for (; b + 16 <= nb; b += 16) {  // quantize_block's results, 16 blocks at a time
    const int64_t i = r * nb + b, off = r * k + b * kQBlock;
    quantize_block16(a + r * lda + b * kQBlock, hi + off, lo + off, d + i, s + i, sq + i);
  }
#endif
  for (; b < nb; ++b) {
    const int64_t i = FD_QAVX2 ? b * m + r : r * nb + b, off = r * k + b * kQBlock;
    quantize_block(a + r * lda + b * kQBlock, hi ? hi + off : hi, lo ? lo + off : lo,
                   q16 ? q16 + (b * m + r) * kQBlock : q16, d + i, s + i, sq + i);
  }
}

#if FD_QVNNI
static inline __m512i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Rows m0 .. m0+MR against panels p0 .. p0+NP, all blocks: one int32 accumulator per (row, panel,
// activation plane), so 2 * MR * NP vpdpbusd chains are in flight.
// Records ahead: far enough for the weight stream to arrive before its panel is reached (the distance
// was chosen by measurement: docs/kernels-measurements.md).
constexpr int64_t kQPrefetch = 16;

template <int KIND, int MR, int NP>
static void qmicro(const GemmArgs& g, const QAct& x, int64_t m0, int64_t p0) {
  using K = QKind<KIND>;
  const int64_t nb = x.nb, rec = q_record_bytes(KIND);
  __m512 acc[MR][NP];
  for (int p = 0; p < NP; ++p) {
    const __m512 b = g.bias ? _mm512_loadu_ps(g.bias + (p0 + p) * kQNR) : _mm512_setzero_ps();
    for (int r = 0; r < MR; ++r) acc[r][p] = b;
  }
  const __m512i low4 = _mm512_set1_epi8(15);
  for (int64_t blk = 0; blk < nb; ++blk) {
    const uint8_t* recs[NP];
    for (int p = 0; p < NP; ++p) recs[p] = (const uint8_t*)g.w + ((p0 + p) * nb + blk) * rec;
    // Each panel's records are one sequential stream; asking for the lines kQPrefetch records ahead
    // keeps several streams' misses in flight, which the hardware prefetcher alone did not.
    for (int p = 0; p < NP; ++p)
      for (int64_t l = 0; l < rec; l += 64) _mm_prefetch((const char*)recs[p] + kQPrefetch * rec + l, _MM_HINT_T0);
    const int64_t off = m0 * x.k + blk * kQBlock;
    __m512i ih[MR][NP], il[MR][NP];
    for (int r = 0; r < MR; ++r)
      for (int p = 0; p < NP; ++p) ih[r][p] = il[r][p] = _mm512_setzero_si512();
    // Quad j of the block (k = 4j .. 4j+3) of every row against the codes w of every panel.
    auto quad = [&](int j, const __m512i* w) {
      for (int r = 0; r < MR; ++r) {
        const __m512i xh = bcast4(x.hi + off + r * x.k + 4 * j), xl = bcast4(x.lo + off + r * x.k + 4 * j);
        for (int p = 0; p < NP; ++p) {
          ih[r][p] = _mm512_dpbusd_epi32(ih[r][p], w[p], xh);
          il[r][p] = _mm512_dpbusd_epi32(il[r][p], w[p], xl);
        }
      }
    };
    __m512i w[NP];
    if (K::kFour) {
      for (int c = 0; c < 4; ++c) {
        __m512i raw[NP];
        for (int p = 0; p < NP; ++p) {
          raw[p] = _mm512_loadu_si512(recs[p] + K::kCodes + 64 * c);
          w[p] = _mm512_and_si512(raw[p], low4);
        }
        quad(2 * c, w);
        for (int p = 0; p < NP; ++p) w[p] = _mm512_and_si512(_mm512_srli_epi16(raw[p], 4), low4);
        quad(2 * c + 1, w);
      }
    } else {
      for (int c = 0; c < 8; ++c) {
        for (int p = 0; p < NP; ++p) w[p] = _mm512_loadu_si512(recs[p] + K::kCodes + 64 * c);
        quad(c, w);
      }
    }
    for (int p = 0; p < NP; ++p) {
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)recs[p]));
      const __m512 mw = K::kMin ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(recs[p] + 32)))
                                : _mm512_setzero_ps();
      for (int r = 0; r < MR; ++r) {
        const int64_t i = (m0 + r) * nb + blk;
        __m512i is = _mm512_add_epi32(_mm512_slli_epi32(ih[r][p], 8), il[r][p]);
        if (K::kZ) is = _mm512_sub_epi32(is, _mm512_set1_epi32(K::kZ * x.sq[i]));
        acc[r][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dw, _mm512_set1_ps(x.d[i])), acc[r][p]);
        if (K::kMin) acc[r][p] = _mm512_fmadd_ps(mw, _mm512_set1_ps(x.s[i]), acc[r][p]);
      }
    }
  }
  for (int p = 0; p < NP; ++p) {
    const int64_t c0 = (p0 + p) * kQNR, cols = std::min<int64_t>(kQNR, g.n - c0);
    const __mmask16 mask = (__mmask16)((1u << cols) - 1);
    for (int r = 0; r < MR; ++r) _mm512_mask_storeu_ps(g.c + (m0 + r) * g.n + c0, mask, acc[r][p]);
  }
}

// One row against one panel (decode's work item): qmicro<KIND, 1, 1>'s integers and fp32 steps, with the
// block's even and odd quads in separate accumulators (four vpdpbusd chains instead of two, so the chains'
// latency stays below the time the panel's records take to arrive), summed exactly in int32 before the
// same scaling: the same bits as qmicro.
template <int KIND>
static void qrow1(const GemmArgs& g, const QAct& x, int64_t m0, int64_t p0) {
  using K = QKind<KIND>;
  const int64_t nb = x.nb, rec = q_record_bytes(KIND);
  __m512 acc = g.bias ? _mm512_loadu_ps(g.bias + p0 * kQNR) : _mm512_setzero_ps();
  const __m512i low4 = _mm512_set1_epi8(15);
  const uint8_t* panel = (const uint8_t*)g.w + p0 * nb * rec;
  for (int64_t blk = 0; blk < nb; ++blk) {
    const uint8_t* r = panel + blk * rec;
    for (int64_t l = 0; l < rec; l += 64) _mm_prefetch((const char*)r + kQPrefetch * rec + l, _MM_HINT_T0);
    const int64_t i = m0 * nb + blk;
    const int8_t *xh = x.hi + m0 * x.k + blk * kQBlock, *xl = x.lo + m0 * x.k + blk * kQBlock;
    __m512i ih[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()}, il[2] = {ih[0], ih[1]};
    auto quad = [&](int j, __m512i w) {
      ih[j & 1] = _mm512_dpbusd_epi32(ih[j & 1], w, bcast4(xh + 4 * j));
      il[j & 1] = _mm512_dpbusd_epi32(il[j & 1], w, bcast4(xl + 4 * j));
    };
    if (K::kFour) {
      for (int c = 0; c < 4; ++c) {
        const __m512i raw = _mm512_loadu_si512(r + K::kCodes + 64 * c);
        quad(2 * c, _mm512_and_si512(raw, low4));
        quad(2 * c + 1, _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4));
      }
    } else {
      for (int c = 0; c < 8; ++c) quad(c, _mm512_loadu_si512(r + K::kCodes + 64 * c));
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)r));
    __m512i is = _mm512_add_epi32(_mm512_slli_epi32(_mm512_add_epi32(ih[0], ih[1]), 8), _mm512_add_epi32(il[0], il[1]));
    if (K::kZ) is = _mm512_sub_epi32(is, _mm512_set1_epi32(K::kZ * x.sq[i]));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dw, _mm512_set1_ps(x.d[i])), acc);
    if (K::kMin) {
      const __m512 mw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(r + 32)));
      acc = _mm512_fmadd_ps(mw, _mm512_set1_ps(x.s[i]), acc);
    }
  }
  const int64_t c0 = p0 * kQNR, cols = std::min<int64_t>(kQNR, g.n - c0);
  _mm512_mask_storeu_ps(g.c + m0 * g.n + c0, (__mmask16)((1u << cols) - 1), acc);
}

#define FD_QMICRO_CASE(mr, np)                   \
  case (mr) * 4 + (np):                          \
    return qmicro<KIND, mr, np>(g, x, m0, p0);

template <int KIND>
static void qitem(const GemmArgs& g, const QAct& x, int64_t m0, int mr, int64_t p0, int np) {
  if (mr == 1 && np == 1) return qrow1<KIND>(g, x, m0, p0);
  switch (mr * 4 + np) {
    FD_QMICRO_CASE(1, 2) FD_QMICRO_CASE(1, 3)
    FD_QMICRO_CASE(2, 1) FD_QMICRO_CASE(2, 2) FD_QMICRO_CASE(2, 3)
    FD_QMICRO_CASE(3, 1) FD_QMICRO_CASE(3, 2) FD_QMICRO_CASE(3, 3)
    FD_QMICRO_CASE(4, 1) FD_QMICRO_CASE(4, 2)
  }
}
#undef FD_QMICRO_CASE

// Rows per micro-kernel. A batch of 16 decode rows is four 4 x 2 blocks (16 vpdpbusd chains; the 8 fp32
// accumulators, touched once a block, may live on the stack); 3-row blocks left a 1-row block whose 4 chains
// are latency-bound and which unpacked the panels' codes once more for a single row. Items of more than one
// row hold kQPanelsRows = 2 panels, so (4, 3) is never asked for.
constexpr int kQMaxRows = 4;
// Panels per work item for 1 row and for more. One row takes one panel per item (qrow1): a thread's run is
// then one linear stream, and the last item, which one thread finishes while the other waits, is small.
constexpr int kQPanelsRows = 2;
constexpr int q_panels_one_row(int) { return 1; }
constexpr bool q_pairs_one_row(int) { return false; }
constexpr int64_t kQChunkRows = 0;  // every item takes all rows
#elif FD_QAVX2
#include "qgemm_avx2.h"
#else
// Portable path: one panel against rows [m0, m0 + mr) at a time; each block's codes are unpacked once
// to [column][k] bytes and reused by every row.
template <int KIND>
static void qitem(const GemmArgs& g, const QAct& x, int64_t m0, int mr, int64_t p0, int np) {
  using K = QKind<KIND>;
  const int64_t nb = x.nb, rec = q_record_bytes(KIND);
  for (int64_t p = p0; p < p0 + np; ++p) {
    float acc[kQMaxRowsPortable][kQNR];
    for (int r = 0; r < mr; ++r)
      for (int c = 0; c < kQNR; ++c) acc[r][c] = g.bias ? g.bias[p * kQNR + c] : 0.0f;
    for (int64_t blk = 0; blk < nb; ++blk) {
      const uint8_t* rp = (const uint8_t*)g.w + (p * nb + blk) * rec;
      const uint8_t* codes = rp + K::kCodes;
      uint8_t u[kQNR][kQBlock];
      for (int c = 0; c < kQNR; ++c)
        for (int j = 0; j < kQBlock; ++j) u[c][j] = q_code(codes, K::kFour, c, j);
      float dw[kQNR], mw[kQNR];
      uint16_t h16[kQNR];
      std::memcpy(h16, rp, sizeof h16);
      for (int c = 0; c < kQNR; ++c) dw[c] = half_to_float(h16[c]);
      if (K::kMin) {
        std::memcpy(h16, rp + 2 * kQNR, sizeof h16);
        for (int c = 0; c < kQNR; ++c) mw[c] = half_to_float(h16[c]);
      }
      for (int r = 0; r < mr; ++r) {
        const int64_t i = (m0 + r) * nb + blk;
        const int64_t off = (m0 + r) * x.k + blk * kQBlock;
        int32_t xq[kQBlock];
        for (int j = 0; j < kQBlock; ++j) xq[j] = 256 * x.hi[off + j] + x.lo[off + j];
        for (int c = 0; c < kQNR; ++c) {
          int32_t is = 0;
          for (int j = 0; j < kQBlock; ++j) is += (int32_t)u[c][j] * xq[j];
          is -= K::kZ * x.sq[i];
          acc[r][c] += (float)is * (dw[c] * x.d[i]);
          if (K::kMin) acc[r][c] += mw[c] * x.s[i];
        }
      }
    }
    const int64_t c0 = p * kQNR, cols = std::min<int64_t>(kQNR, g.n - c0);
    for (int r = 0; r < mr; ++r) std::memcpy(g.c + (m0 + r) * g.n + c0, acc[r], cols * sizeof(float));
  }
}

constexpr int kQMaxRows = kQMaxRowsPortable;
constexpr int kQPanelsRows = 2;
constexpr int q_panels_one_row(int) { return 3; }
constexpr bool q_pairs_one_row(int) { return false; }
constexpr int64_t kQChunkRows = 0;  // every item takes all rows
#endif

// Rows [0, g.m) of g.a as a QAct in the calling thread's own scratch (grown on demand, kept for the
// thread's next call). quantize_row is a function of the row alone, so every thread that quantizes the
// same rows holds the same integers and factors.
static QAct quantize_rows_local(const GemmArgs& g) {
  struct Scratch {
    std::vector<int8_t> hi, lo;
    std::vector<int16_t> q16;
    std::vector<float> d, s;
    std::vector<int32_t> sq;
  };
  thread_local Scratch t;
  const int64_t k = g.k, nb = k / kQBlock, m = g.m;
  const bool planes = !FD_QAVX2;
  if ((int64_t)t.d.size() < m * nb) {
    t.hi.resize(m * k);  // on the AVX2 path, a one-row call's planes (below)
    t.lo.resize(m * k);
    t.q16.resize(planes ? 0 : m * k);
    t.d.resize(m * nb);
    t.s.resize(m * nb);
    t.sq.resize(m * nb);
  }
  int8_t *hi = planes ? t.hi.data() : nullptr, *lo = planes ? t.lo.data() : nullptr;
  int16_t* q16 = planes ? nullptr : t.q16.data();
  for (int64_t r = 0; r < m; ++r)
    quantize_row(g.a, g.lda, r, m, k, hi, lo, q16, t.d.data(), t.s.data(), t.sq.data());
#if FD_QAVX2
  if (m == 1) {  // the one-row kernel's planes (qgemm_avx2_row.h), split once per call
    hi = t.hi.data(), lo = t.lo.data();
    q_split_planes(q16, k, hi, lo);
  }
#endif
  return QAct{hi, lo, q16, t.d.data(), t.s.data(), t.sq.data(), k, nb, m};
}

// How qgemm splits g: work items are (row chunk, group of np panels) pairs, chunk-major: item i is group
// i % groups against the chunk's rows [i / groups * chunk_rows, + chunk_rows), taken `rows` at a time.
// Paths with kQChunkRows 0, and one row, have a single chunk of all rows. With pair (one row, where
// q_pairs_one_row), item i < pair takes group i and group i + pair (if any): a thread's own run of items is
// then two runs of panels half the matrix apart, read as two streams.
struct QSplit {
  int np;
  int64_t groups, rows, chunk_rows, items, pair;
};

static QSplit q_split(const GemmArgs& g) {
  const int64_t panels = (g.n + kQNR - 1) / kQNR;
  const int np = g.m == 1 ? q_panels_one_row(g.kind) : kQPanelsRows;
  const int64_t nrb = (g.m + kQMaxRows - 1) / kQMaxRows, groups = (panels + np - 1) / np;
  const int64_t chunks = kQChunkRows && g.m > 1 ? (g.m + kQChunkRows - 1) / kQChunkRows : 1;
  const int64_t pair = g.m == 1 && q_pairs_one_row(g.kind) && groups > 1 ? (groups + 1) / 2 : 0;
  return QSplit{np, groups, (g.m + nrb - 1) / nrb, (g.m + chunks - 1) / chunks,  // balanced
                pair ? pair : groups * chunks, pair};
}

template <int KIND>
static void run_items(const GemmArgs& g, const QAct& x, StealRanges& work, const QSplit& sp) {
  const int64_t m = g.m, panels = (g.n + kQNR - 1) / kQNR;
  for (int64_t it; (it = work.next()) >= 0;) {
    const int64_t p0 = it % sp.groups * sp.np, np = std::min<int64_t>(sp.np, panels - p0);
    const int64_t r0 = it / sp.groups * sp.chunk_rows, r1 = std::min(m, r0 + sp.chunk_rows);
#if FD_QAVX2
    if (sp.pair) {  // one row, np == 1 (q_panels_one_row)
      const int64_t pb = it + sp.pair;
      if (pb < panels) {
        qitem_pair<KIND>(g, x, 0, it, pb);
        continue;
      }
    }
    if (m > 1) {
      for (int64_t p = p0; p < p0 + np; ++p) qpanel_rows<KIND>(g, x, r0, r1, p);
      continue;
    }
#endif
    for (int64_t m0 = r0; m0 < r1; m0 += sp.rows)
      qitem<KIND>(g, x, m0, (int)std::min(sp.rows, r1 - m0), p0, (int)np);
  }
}

// Work items are groups of panels, each against every block of rows of a row chunk, so a thread reads a
// group's weights once per chunk and reuses them from L1 for the chunk's row blocks. Each thread walks its
// own contiguous run of items and then steals from the others' (ranges.h), so it reads the weights as long
// sequential runs rather than small pieces scattered over the matrix (docs/kernels-measurements.md).
template <int KIND>
static void qgemm_kind(const GemmArgs& g) {
  const int64_t m = g.m, k = g.k, nb = k / kQBlock;
  const QSplit sp = q_split(g);
  const bool threaded = sp.items > 1 && m * g.n * k >= (1 << 16);
  StealRanges work(sp.items);
  if (m == 1) {
    // Decode's one row: every thread quantizes it itself, inside the parallel region and into its own
    // scratch, so the work overlaps the other threads' wake-up and no call allocates.
#pragma omp parallel if (threaded)
    run_items<KIND>(g, quantize_rows_local(g), work, sp);
    return;
  }
  // Uninitialized: quantize_row writes every element (zeroing them first was a serial pass over 2.6 bytes
  // per activation, with the other threads idle, in prompt-sized GEMMs on CPUs without AMX).
  // The AVX2 path reads Q as int16, the others as two int8 planes.
  const bool planes = !FD_QAVX2;
  std::unique_ptr<int8_t[]> hi(planes ? new int8_t[m * k] : nullptr), lo(planes ? new int8_t[m * k] : nullptr);
  std::unique_ptr<int16_t[]> q16(planes ? nullptr : new int16_t[m * k]);
  std::unique_ptr<float[]> d(new float[m * nb]), s(new float[m * nb]);
  std::unique_ptr<int32_t[]> sq(new int32_t[m * nb]);
  const bool big = m * k >= (1 << 16);
#pragma omp parallel for schedule(static) if (big)
  for (int64_t r = 0; r < m; ++r)
    quantize_row(g.a, g.lda, r, m, k, hi.get(), lo.get(), q16.get(), d.get(), s.get(), sq.get());
  const QAct x{hi.get(), lo.get(), q16.get(), d.get(), s.get(), sq.get(), k, nb, m};
#pragma omp parallel if (threaded)
  run_items<KIND>(g, x, work, sp);
}

static void qgemm(const GemmArgs& g) {
  if (g.kind == kQ4_0) return qgemm_kind<kQ4_0>(g);
  if (g.kind == kQ4_1) return qgemm_kind<kQ4_1>(g);
  qgemm_kind<kQ8_0>(g);
}

// Inside a parallel region (decode_region.cc): the calling thread's share of qgemm(g), items from `work`
// (reset to q_split(g).items), its rows quantized into its own scratch. The items and their arithmetic
// are qgemm's, so the results are its bits whichever thread takes which item.
static void qgemm_share(const GemmArgs& g, StealRanges& work) {
  const QSplit sp = q_split(g);
  const QAct x = quantize_rows_local(g);
  if (g.kind == kQ4_0) return run_items<kQ4_0>(g, x, work, sp);
  if (g.kind == kQ4_1) return run_items<kQ4_1>(g, x, work, sp);
  run_items<kQ8_0>(g, x, work, sp);
}

static int64_t qgemm_items(const GemmArgs& g) { return q_split(g).items; }

// The weights of the items qgemm_share gives thread tid of nth first (its own StealRanges range, walked
// front to back; others steal from its back): what the region prefetches for the thread while it waits at
// a barrier before the GEMM.
static region::Bytes qgemm_own_weights(const GemmArgs& g, int tid, int nth) {
  const QSplit sp = q_split(g);
  const int64_t panels = (g.n + kQNR - 1) / kQNR, panel_bytes = g.k / kQBlock * q_record_bytes(g.kind);
  const int64_t i0 = sp.items * tid / nth, i1 = sp.items * (tid + 1) / nth;
  // Its first row chunk's groups (the region's GEMMs have a single chunk).
  const int64_t g0 = i0 % sp.groups, g1 = std::min(sp.groups, g0 + (i1 - i0));
  const int64_t p0 = std::min(panels, g0 * sp.np), p1 = std::min(panels, g1 * sp.np);
  return {(const char*)g.w + p0 * panel_bytes, (p1 - p0) * panel_bytes};
}

