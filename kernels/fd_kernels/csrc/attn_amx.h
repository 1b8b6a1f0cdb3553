// Prompt-row attention on AMX tiles, included by attn_impl.h in the AVX-512 namespace only (FD_W == 16);
// attn_impl.h's use_amx_attention says which rows take it.
// No include guard on purpose.
//
// Numerics: keys and values are the cache's bf16 values; q and the probabilities are each split into two
// bf16 terms, x = hi + lo with hi = x truncated to bf16 (exact: x - hi is an fp32 value) and lo =
// bf16(x - hi) rounded to nearest, so they keep ~16 bits instead of 8 (relative error <= 2^-16) and the
// tiles' exact products and fp32 sums give nearly the lane path's fp32 attention over the same cache.
// q is scaled by scale * log2(e) before it is split, so the scores are in base 2 and the softmax takes
// vexp2_nonpos (vexp.h, relative error <= 3e-7); scores are masked and soft-maxed in fp32, online per
// chunk of kAmxKeys keys at absolute key positions, as the lane path does per chunk. A row's
// result therefore depends on its own query and keys only, never on the other rows of its tile or on
// where a prefill chunk boundary fell.
//
// Layout: a lane item's 16 rows are the columns of every tile product, so the softmax runs with rows in
// vector lanes (no horizontal sums), as in the lane path:
//   scores^T [keys x rows] = K [keys x hd] . Q^T, with Q^T in the pair-interleaved (VNNI) B layout;
//   out^T [hd x rows]     += V^T [hd x keys] . P^T, with P^T in the VNNI B layout.
// K (bf16, [keys][hd]) and V^T (bf16, [hd][keys]) are made once per (sequence, KV head) for every item
// that reads them (amx_kv_prepare), since a prompt's items read the same keys many times.

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,bmi2,avx512bf16,amx-tile,amx-bf16")

constexpr int64_t kAmxKeys = 64;  // keys per online-softmax update: four 16-key score tiles

struct AmxKv {
  const uint16_t* k;   // [nk_pad][hd]
  const uint16_t* vt;  // [hd][nk_pad]
  int64_t nk_pad;
};

static inline __m512i amx_round_hi(vf x) {  // fp32 -> bf16 bits in the high half, as amx.cc rounds
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  return _mm512_and_si512(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))),
                          _mm512_set1_epi32((int)0xFFFF0000u));
}

// Two rows x0, x1 (16 lanes each) as two bf16 terms in the VNNI pair layout: lane r's dword holds
// (x0[r], x1[r]) in its low and high halves. hi is each value truncated to bf16; lo = bf16(x - hi), rounded
// to nearest (vcvtne2ps2bf16), then interleaved into pairs.
static inline void amx_split_pair(vf x0, vf x1, __m512i& hi, __m512i& lo) {
  const __m512i u0 = _mm512_castps_si512(x0), u1 = _mm512_castps_si512(x1);
  hi = _mm512_mask_blend_epi16(0x55555555u, u1, _mm512_srli_epi32(u0, 16));
  const __m512i keep = _mm512_set1_epi32((int)0xFFFF0000u);
  const vf r0 = vsub(x0, _mm512_castsi512_ps(_mm512_and_si512(u0, keep)));
  const vf r1 = vsub(x1, _mm512_castsi512_ps(_mm512_and_si512(u1, keep)));
  const __m512i halves = (__m512i)_mm512_cvtne2ps_pbh(r1, r0);  // words 0-15: r0, 16-31: r1
  const __m512i pairs = _mm512_setr_epi32(0x00100000, 0x00110001, 0x00120002, 0x00130003, 0x00140004, 0x00150005,
                                          0x00160006, 0x00170007, 0x00180008, 0x00190009, 0x001A000A, 0x001B000B,
                                          0x001C000C, 0x001D000D, 0x001E000E, 0x001F000F);
  lo = _mm512_permutexvar_epi16(pairs, halves);
}

static inline void amx_store_bf16(uint16_t* o, vf x) {
  _mm256_storeu_si256((__m256i*)o, _mm512_cvtepi32_epi16(_mm512_srli_epi32(amx_round_hi(x), 16)));
}

// Keys [k0, k0 + kAmxKeys) of KV head g into K and V^T (zeros past nk). Groups of 16 keys inside one
// block are transposed with gathers; other layouts take the element loop.
template <int KV>
static void amx_kv_prepare(const AttnArgs& a, const int64_t* bt, int64_t g, int64_t nk, int64_t k0, uint16_t* kb,
                           uint16_t* vt, int64_t nk_pad) {
  const int64_t hd = a.head_dim;
  for (int64_t j0 = k0; j0 < k0 + kAmxKeys; j0 += 16) {
    const int64_t n = std::max<int64_t>(0, std::min<int64_t>(16, nk - j0));
    for (int64_t j = 0; j < n; ++j) {
      const int64_t base = key_base(a, bt, g, j0 + j);
      uint16_t* o = kb + (j0 + j) * hd;
      if constexpr (KV == kKvBF16) {
        std::memcpy(o, (const uint16_t*)a.k_cache + base, hd * sizeof(uint16_t));
      } else {
        for (int64_t d = 0; d < hd; d += 16) amx_store_bf16(o + d, vload((const float*)a.k_cache + base + d));
      }
    }
    for (int64_t j = n; j < 16; ++j) std::memset(kb + (j0 + j) * hd, 0, hd * sizeof(uint16_t));
    const bool one_block = n == 16 && j0 % a.block_size + 16 <= a.block_size;
    if (one_block) {  // 16 rows hd apart: lane j gathers key j's element
      const int64_t base = key_base(a, bt, g, j0);
      if constexpr (KV == kKvBF16) {
        const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                               _mm512_set1_epi32((int)(hd / 2)));
        const int* src = (const int*)((const uint16_t*)a.v_cache + base);
        for (int64_t d = 0; d < hd; d += 2) {
          const __m512i w = _mm512_i32gather_epi32(idx, src + d / 2, 4);
          _mm256_storeu_si256((__m256i*)(vt + d * nk_pad + j0), _mm512_cvtepi32_epi16(w));
          _mm256_storeu_si256((__m256i*)(vt + (d + 1) * nk_pad + j0), _mm512_cvtepi32_epi16(_mm512_srli_epi32(w, 16)));
        }
      } else {
        const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                               _mm512_set1_epi32((int)hd));
        const float* src = (const float*)a.v_cache + base;
        for (int64_t d = 0; d < hd; ++d) amx_store_bf16(vt + d * nk_pad + j0, _mm512_i32gather_ps(idx, src + d, 4));
      }
      continue;
    }
    for (int64_t d = 0; d < hd; ++d) {
      for (int64_t j = 0; j < 16; ++j) {
        float v = 0.0f;
        if (j < n) v = kv_at<KV>(a.v_cache, key_base(a, bt, g, j0 + j) + d);
        uint32_t u;
        std::memcpy(&u, &v, 4);
        u += 0x7FFF + ((u >> 16) & 1);
        vt[d * nk_pad + j0 + j] = (uint16_t)(u >> 16);
      }
    }
  }
}

// In-register transpose of a 16 x 16 fp32 block: afterwards m[i][j] is the old m[j][i].
static inline void amx_transpose16(vf* m) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {  // 32-bit interleave of row pairs
    t[i] = _mm512_unpacklo_ps(m[i], m[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(m[i], m[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // 64-bit interleave
    for (int k = 0; k < 2; ++k) {
      const __m512d x = _mm512_castps_pd(t[i + k]), y = _mm512_castps_pd(t[i + k + 2]);
      m[i + 2 * k] = _mm512_castpd_ps(_mm512_unpacklo_pd(x, y));
      m[i + 2 * k + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(x, y));
    }
  }
  for (int i = 0; i < 4; ++i) {  // 128-bit lanes: rows i, i + 4 and i + 8, i + 12
    t[i] = _mm512_shuffle_f32x4(m[i], m[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(m[i], m[i + 4], 0xDD);
    t[i + 8] = _mm512_shuffle_f32x4(m[i + 8], m[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(m[i + 8], m[i + 12], 0xDD);
  }
  for (int i = 0; i < 4; ++i) {
    m[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    m[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xDD);
    m[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
    m[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xDD);
  }
}

// attend_amx runs under load_amx_tile_config (amx_tiles.h), set once per thread before its items.
static void amx_tile_done() { _tile_release(); }

// Accumulator T += A_t x (B0 + B1), with A_t the 16 x 32 bf16 tile at a (rows `stride` bytes apart) loaded
// into tile 4, and B0 / B1 the two terms already in those tiles. Macros: the tile intrinsics take their
// tile numbers as literal tokens.
#define FD_AMX_ACC_TWO_TERMS(T, a, stride, B0, B1) \
  do {                                             \
    _tile_loadd(4, (a), (stride));                 \
    _tile_dpbf16ps(T, 4, B0);                      \
    _tile_dpbf16ps(T, 4, B1);                      \
  } while (0)

// Accumulators 0-1 (a chunk's first 32 keys: a last chunk with at most 32 keys), A_t at a + t * a_step.
#define FD_AMX_ACC2_TWO_TERMS(a, a_step, stride, B0, B1)      \
  do {                                                         \
    FD_AMX_ACC_TWO_TERMS(0, (a), stride, B0, B1);              \
    FD_AMX_ACC_TWO_TERMS(1, (a) + (a_step), stride, B0, B1);   \
  } while (0)

// Accumulators 0-3, A_t at a + t * a_step.
#define FD_AMX_ACC4_TWO_TERMS(a, a_step, stride, B0, B1)          \
  do {                                                             \
    FD_AMX_ACC2_TWO_TERMS(a, a_step, stride, B0, B1);              \
    FD_AMX_ACC_TWO_TERMS(2, (a) + 2 * (a_step), stride, B0, B1);   \
    FD_AMX_ACC_TWO_TERMS(3, (a) + 3 * (a_step), stride, B0, B1);   \
  } while (0)

// Accumulators 0-3 to [64][16] fp32 (tile t's 16 rows at out + 256 t), then zeroed for the next use.
static inline void amx_store4(float* out) {
  _tile_stored(0, out, 64);
  _tile_stored(1, out + 256, 64);
  _tile_stored(2, out + 512, 64);
  _tile_stored(3, out + 768, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
}

// Up to 16 rows of one KV head's GQA group in the lanes; idle lanes repeat the last row. hd % 64 == 0.
// The calling thread has run load_amx_tile_config.
static void attend_amx(const AttnArgs& a, const AmxKv& kv, const AttnRow* rows, int64_t nrows) {
  const int64_t hd = a.head_dim, ld = kv.nk_pad;
  alignas(64) uint16_t qt[2][kMaxHeadDim * 16];    // Q^T's hi and lo terms: [hd / 2][16 lanes][2]
  alignas(64) float s[kAmxKeys * 16], part[kMaxHeadDim * 16];  // scores^T, out^T's update by one chunk
  alignas(64) uint16_t pt[2][kAmxKeys * 16];        // P^T's hi and lo terms: [keys / 2][16 lanes][2]
  alignas(64) float ot[kMaxHeadDim * 16], lim[16];
  int64_t nk = 0, min_nk = INT64_MAX;
  // q * scale * log2(e)'s two bf16 terms row by row ([16][hd], bf16), then transposed as 32-bit dim pairs
  // into Q^T.
  alignas(64) uint16_t qrow[2][16 * kMaxHeadDim];
  const vf qscale = vset1(a.scale * kLog2e);
  for (int64_t r = 0; r < 16; ++r) {
    const AttnRow& row = rows[std::min(r, nrows - 1)];
    const float* qp = a.q + (row.token * a.num_heads + row.head) * hd;
    for (int64_t d = 0; d < hd; d += 16) {
      const vf x = vmul(vload(qp + d), qscale);
      const __m512i u = _mm512_castps_si512(x);
      const vf rest = vsub(x, _mm512_castsi512_ps(_mm512_and_si512(u, _mm512_set1_epi32((int)0xFFFF0000u))));
      _mm256_storeu_si256((__m256i*)(qrow[0] + r * hd + d), _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16)));
      _mm256_storeu_si256((__m256i*)(qrow[1] + r * hd + d),
                          _mm512_cvtepi32_epi16(_mm512_srli_epi32(amx_round_hi(rest), 16)));
    }
    lim[r] = (float)(row.nk - 1);
    nk = std::max(nk, row.nk);
    min_nk = std::min(min_nk, row.nk);
  }
  const __m512i rows_idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                              _mm512_set1_epi32((int)(hd / 2)));
  for (int t = 0; t < 2; ++t)
    for (int64_t pr = 0; pr < hd / 2; ++pr)
      _mm512_storeu_si512(qt[t] + pr * 32, _mm512_i32gather_epi32(rows_idx, (const int*)qrow[t] + pr, 4));
  for (int64_t i = 0; i < hd * 16; ++i) ot[i] = 0.0f;
  const vf limit = vload(lim);
  vf mx = vset1(-INFINITY), l = vzero();
  _tile_zero(0);  // amx_store4 leaves them zeroed after each use
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  // Software-pipelined over the chunks: the tiles compute the next chunk's scores while the vector units
  // run this chunk's softmax and add the previous chunk's update into out^T. The arithmetic and its order
  // per lane are those of the plain loop (scores, softmax, P.V, out^T = out^T * corr + update).
  // A chunk with at most 32 keys (the last) skips the products of its zero-padded upper half: their
  // scores are never read and their weights are 0, so nothing else changes.
  auto scores = [&](int64_t k0) {  // into accumulators 0-3
    const bool half = nk - k0 <= 32;
    for (int64_t d = 0; d < hd; d += 32) {
      _tile_loadd(6, qt[0] + d * 16, 64);
      _tile_loadd(7, qt[1] + d * 16, 64);
      if (half) {
        FD_AMX_ACC2_TWO_TERMS(kv.k + k0 * hd + d, 16 * hd, hd * 2, 6, 7);
      } else {
        FD_AMX_ACC4_TWO_TERMS(kv.k + k0 * hd + d, 16 * hd, hd * 2, 6, 7);
      }
    }
  };
  auto add_update = [&](vf corr) {
    for (int64_t d = 0; d < hd; ++d) vstore(ot + d * 16, vfma(vload(ot + d * 16), corr, vload(part + d * 16)));
  };
  scores(0);
  amx_store4(s);
  vf corr_prev = vzero();  // ot is 0: the first update is added as 0 * 0 + update
  for (int64_t k0 = 0; k0 < nk; k0 += kAmxKeys) {
    const bool more = k0 + kAmxKeys < nk;
    if (more) scores(k0 + kAmxKeys);
    const int64_t n = std::min<int64_t>(kAmxKeys, nk - k0);
    // Keys from min_nk on lie past some lane's limit (the diagonal chunk): masked to -inf, whose 2^x is 0.
    const int64_t unmasked = std::max<int64_t>(0, std::min(n, min_nk - k0));
    auto score = [&](int64_t j) {
      const vf x = vload(s + 16 * j);
      return j < unmasked ? x : vmask_le(x, (float)(k0 + j), limit);
    };
    vf cmax = mx;
    for (int64_t j = 0; j < n; ++j) cmax = vmax(cmax, score(j));
    const vf corr = vexp2_nonpos(vsub(mx, cmax));  // 0 on the first chunk (mx = -inf)
    // Two keys at a time, straight into P^T's pair layout (keys past n weigh 0).
    vf psum = vzero();
    const int64_t kend = n <= 32 ? 32 : kAmxKeys;  // keys the P.V below takes
    for (int64_t j = 0; j < kend; j += 2) {
      const vf p0 = j < n ? vexp2_nonpos(vsub(score(j), cmax)) : vzero();
      const vf p1 = j + 1 < n ? vexp2_nonpos(vsub(score(j + 1), cmax)) : vzero();
      psum = vadd(vadd(psum, p0), p1);
      __m512i hi, lo;
      amx_split_pair(p0, p1, hi, lo);
      _mm512_storeu_si512(pt[0] + j * 16, hi);
      _mm512_storeu_si512(pt[1] + j * 16, lo);
    }
    l = vfma(l, corr, psum);
    mx = cmax;
    if (k0 > 0) add_update(corr_prev);
    if (more) amx_store4(s);  // the next chunk's scores, done by now
    for (int64_t d0 = 0; d0 < hd; d0 += 64) {
      for (int64_t kt = 0; kt < kend; kt += 32) {
        _tile_loadd(5, pt[0] + kt * 16, 64);
        _tile_loadd(6, pt[1] + kt * 16, 64);
        FD_AMX_ACC4_TWO_TERMS(kv.vt + d0 * ld + k0 + kt, 16 * ld, ld * 2, 5, 6);
      }
      amx_store4(part + d0 * 16);
    }
    corr_prev = corr;
  }
  add_update(corr_prev);
  // out^T / l, transposed back 16 dims at a time: lane r's values go to row r's output.
  const vf inv = _mm512_div_ps(vset1(1.0f), l);
  for (int64_t d0 = 0; d0 < hd; d0 += 16) {
    vf blk[16];
    for (int i = 0; i < 16; ++i) blk[i] = vmul(vload(ot + (d0 + i) * 16), inv);
    amx_transpose16(blk);
    for (int64_t r = 0; r < nrows; ++r)
      vstore(a.out + (rows[r].token * a.num_heads + rows[r].head) * hd + d0, blk[r]);
  }
}

#undef FD_AMX_ACC4_TWO_TERMS
#undef FD_AMX_ACC2_TWO_TERMS

#pragma GCC pop_options
