// The AVX2 GGUF GEMM's one-row kernel for the 4-bit kinds (decode's work item: one row against NP panels),
// included by qgemm_avx2.h inside isa_qavx2 (FD_QAVX2). No include guard: it belongs to that one namespace.
//
// The same integers as qrow (qgemm_avx2.h), with fewer instructions per code: the row's Q is split once per call into
// the VNNI path's two signed byte planes, Q = 256 * hi + lo (q_split_planes), and vpmaddubsw multiplies
// 32 codes (u <= 15, unsigned) by 32 bytes of a plane, adding adjacent pairs into int16: each pair is at
// most 2 * 15 * 128 = 3840 in magnitude, and a lane adds one pair per quad, 8 quads a block, at most
// 30720 < 32767, so neither the pair sums nor the block's int16 sums saturate or wrap. Per half panel the
// block's two int16 sums become int32 by vpmaddwd against 256 and 1, which adds each column's two lanes:
// sum(u * hi) * 256 + sum(u * lo) = sum(u * Q), qrow's isum, exactly. The fp32 steps are qrow's, in its
// order, so the same bits. Q8_0's 8-bit codes would saturate vpmaddubsw's pairs; it stays on qrow.

// Q = 256 * hi + lo for the k values of q, lo the sign-extended low byte (|hi| <= 127, as
// quantize_block's portable and VNNI paths store them).
static void q_split_planes(const int16_t* q, int64_t k, int8_t* hi, int8_t* lo) {
  for (int64_t j = 0; j < k; j += 32) {
    __m256i h[2], l[2];
    for (int i = 0; i < 2; ++i) {
      const __m256i v = _mm256_loadu_si256((const __m256i*)(q + j + 16 * i));
      l[i] = _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 8);
      h[i] = _mm256_srai_epi16(_mm256_sub_epi16(v, l[i]), 8);
    }
    // packs interleaves 128-bit lanes; the permute restores k order. Every value fits int8: exact.
    _mm256_storeu_si256((__m256i*)(hi + j), _mm256_permute4x64_epi64(_mm256_packs_epi16(h[0], h[1]), 0xD8));
    _mm256_storeu_si256((__m256i*)(lo + j), _mm256_permute4x64_epi64(_mm256_packs_epi16(l[0], l[1]), 0xD8));
  }
}

static inline __m256i bcast4_256(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Row m0 against panels ps[0 .. NP), all blocks; x.hi / x.lo hold the row's planes. The panels need not
// be adjacent: two far apart are two streams through memory, which the hardware prefetchers keep further
// ahead than one (q_split's pairs). Per block, panel after panel, each one pass over its 4 chunks with
// both half panels at once, so a chunk's 4 plane broadcasts are used as soon as they are loaded (hoisted
// across the half panels they would outnumber the registers and spill): the live registers are one
// panel's 4 int16 sums, the 4 broadcasts, one half panel's codes and the fp32 outputs.
template <int KIND, int NP>
static void qrow_planes(const GemmArgs& g, const QAct& x, int64_t m0, const int64_t* ps) {
  using K = QKind<KIND>;
  static_assert(K::kFour, "vpmaddubsw's pair sums are exact for 4-bit codes only");
  const int64_t nb = x.nb, rec = q_record_bytes(KIND);
  __m256 acc[NP][2];
  for (int p = 0; p < NP; ++p)
    for (int h = 0; h < 2; ++h)
      acc[p][h] = g.bias ? _mm256_loadu_ps(g.bias + ps[p] * kQNR + 8 * h) : _mm256_setzero_ps();
  const __m256i low4 = _mm256_set1_epi8(15);
  for (int64_t blk = 0; blk < nb; ++blk) {
    const int64_t i = blk * x.m + m0;
    const int8_t *xh = x.hi + m0 * x.k + blk * kQBlock, *xl = x.lo + m0 * x.k + blk * kQBlock;
    for (int p = 0; p < NP; ++p) {
      const uint8_t* rp = (const uint8_t*)g.w + (ps[p] * nb + blk) * rec;
      for (int64_t l = 0; l < rec; l += 64) _mm_prefetch((const char*)rp + kQPrefetch * rec + l, _MM_HINT_T0);
      // int16 sums of half panel h against the hi and the lo plane: lane 2c + e holds column 8h + c's pairs
      // (k = 4j + 2e, 4j + 2e + 1) summed over the quads j.
      __m256i sh[2], sl[2];
      sh[0] = sh[1] = sl[0] = sl[1] = _mm256_setzero_si256();
      for (int c = 0; c < 4; ++c) {  // chunk c: low nibbles are quad 2c, high nibbles quad 2c + 1
        const __m256i h0 = bcast4_256(xh + 8 * c), l0 = bcast4_256(xl + 8 * c);
        const __m256i h1 = bcast4_256(xh + 8 * c + 4), l1 = bcast4_256(xl + 8 * c + 4);
        for (int h = 0; h < 2; ++h) {  // columns 8h .. 8h+7
          const __m256i raw = _mm256_loadu_si256((const __m256i*)(rp + K::kCodes + 64 * c + 32 * h));
          const __m256i u0 = _mm256_and_si256(raw, low4), u1 = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
          sh[h] = _mm256_add_epi16(sh[h], _mm256_add_epi16(_mm256_maddubs_epi16(u0, h0), _mm256_maddubs_epi16(u1, h1)));
          sl[h] = _mm256_add_epi16(sl[h], _mm256_add_epi16(_mm256_maddubs_epi16(u0, l0), _mm256_maddubs_epi16(u1, l1)));
        }
        // Keeps the sums in registers chunk by chunk: without it GCC hoists every chunk's products ahead of
        // their adds and spills them.
        asm("" : "+x"(sh[0]), "+x"(sl[0]), "+x"(sh[1]), "+x"(sl[1]));
      }
      const __m256i by256 = _mm256_set1_epi16(256), by1 = _mm256_set1_epi16(1);
      for (int h = 0; h < 2; ++h) {
        const __m256i s = _mm256_add_epi32(_mm256_madd_epi16(sh[h], by256), _mm256_madd_epi16(sl[h], by1));
        __m256 dw, mw;
        half_scales<KIND>(rp, h, dw, mw);
        acc[p][h] = scale_block<KIND>(acc[p][h], s, dw, mw, x, i);
      }
    }
  }
  for (int p = 0; p < NP; ++p) {
    const int64_t c0 = ps[p] * kQNR, cols = std::min<int64_t>(kQNR, g.n - c0);
    float* out = g.c + m0 * g.n + c0;
    if (cols == kQNR) {
      _mm256_storeu_ps(out, acc[p][0]);
      _mm256_storeu_ps(out + 8, acc[p][1]);
    } else {  // the last panel of an n that is not a multiple of 16
      float tmp[kQNR];
      _mm256_storeu_ps(tmp, acc[p][0]);
      _mm256_storeu_ps(tmp + 8, acc[p][1]);
      std::memcpy(out, tmp, cols * sizeof(float));
    }
  }
}
