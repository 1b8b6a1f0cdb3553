// Prompt-row attention on AMX tiles, included by attn_impl.h in the AVX-512 namespace only (FD_W == 16);
// attn_impl.h's use_amx_attention says which rows take it.
// No include guard on purpose.
//
// Numerics: keys and values are the cache's bf16 values; q and the probabilities are each split into two
// bf16 terms, x = hi + lo with hi = x truncated to bf16 (exact: x - hi is an fp32 value) and lo =
// bf16(x - hi) rounded to nearest, so they keep ~16 bits instead of 8 (relative error <= 2^-16) and the
// tiles' exact products and fp32 sums give nearly the lane path's fp32 attention over the same cache.
// q is scaled by scale * log2(e) before it is split, so the scores are in base 2 and the weights are 2^t
// by vexp2_unit (vexp.h, relative error ~1.5e-7) and vscalefps; scores are masked and soft-maxed in fp32,
// online per chunk of kAmxKeys keys at absolute key positions, as the lane path does per chunk. A row's
// result therefore depends on its own query and keys only, never on the other rows of its tile or on
// where a prefill chunk boundary fell.
//
// Layout: a lane item's 16 rows are the columns of every tile product, so the softmax runs with rows in
// vector lanes (no horizontal sums), as in the lane path:
//   scores^T [keys x rows] = K [keys x hd] . Q^T, with Q^T in the pair-interleaved (VNNI) B layout;
//   out^T [hd x rows]     += V^T [hd x keys] . P^T, with P^T in the VNNI B layout.
// K and V^T (bf16, tile by tile: AmxKv) are made once per (sequence, KV head) for every item that reads
// them (amx_kv_prepare), since a prompt's items read the same keys many times.

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,bmi2,avx512bf16,amx-tile,amx-bf16,prfchw")

constexpr int64_t kAmxKeys = 64;  // keys per online-softmax update: four 16-key score tiles

// K and V^T tile by tile: every tile the products load (16 keys x 32 dims of K, 16 dims x 32 keys of V^T)
// is one contiguous 1 KB block, so a tile load reads 16 whole lines instead of half of each of 16 lines
// whose other halves the next load reads again.
struct AmxKv {
  const uint16_t* k;   // [nk_pad / 16][hd / 32][16 keys][32 dims]
  const uint16_t* vt;  // [nk_pad / kAmxKeys][kAmxKeys / 32][hd][32 keys]
};

static inline int64_t amx_k_at(int64_t hd, int64_t key, int64_t d) {
  return (key / 16 * (hd / 32) + d / 32) * 512 + key % 16 * 32 + d % 32;
}

static inline int64_t amx_vt_at(int64_t hd, int64_t key, int64_t d) {
  return key / 32 * 32 * hd + d * 32 + key % 32;
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
  // simd.h's vround_bf16, the rounding amx.cc's tiles take.
  _mm256_storeu_si256((__m256i*)o, _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(vround_bf16(x)), 16)));
}

// Keys [k0, k0 + kAmxKeys) of KV head g into K and V^T (zeros past nk). Groups of 16 keys inside one
// block are transposed with gathers; other layouts take the element loop. V^T is kept chunk by chunk
// rather than as one [hd][nk_pad] matrix: rows nk_pad * 2 bytes apart (a power of two for power-of-two
// prompts) would fall into a few L1 sets and evict each other.
template <int KV>
static void amx_kv_prepare(const AttnArgs& a, const int64_t* bt, int64_t g, int64_t nk, int64_t k0, uint16_t* kb,
                           uint16_t* vt) {
  const int64_t hd = a.head_dim;
  for (int64_t j0 = k0; j0 < k0 + kAmxKeys; j0 += 16) {
    const int64_t n = std::max<int64_t>(0, std::min<int64_t>(16, nk - j0));
    for (int64_t j = 0; j < n; ++j) {
      const int64_t base = key_base(a, bt, g, j0 + j);
      for (int64_t d = 0; d < hd; d += 32) {
        uint16_t* o = kb + amx_k_at(hd, j0 + j, d);
        if constexpr (KV == kKvBF16) {
          std::memcpy(o, (const uint16_t*)a.k_cache + base + d, 32 * sizeof(uint16_t));
        } else {
          amx_store_bf16(o, vload((const float*)a.k_cache + base + d));
          amx_store_bf16(o + 16, vload((const float*)a.k_cache + base + d + 16));
        }
      }
    }
    for (int64_t j = n; j < 16; ++j)
      for (int64_t d = 0; d < hd; d += 32) std::memset(kb + amx_k_at(hd, j0 + j, d), 0, 32 * sizeof(uint16_t));
    const bool one_block = n == 16 && j0 % a.block_size + 16 <= a.block_size;
    if (one_block) {  // 16 rows hd apart: lane j gathers key j's element
      const int64_t base = key_base(a, bt, g, j0);
      if constexpr (KV == kKvBF16) {
        const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                               _mm512_set1_epi32((int)(hd / 2)));
        const int* src = (const int*)((const uint16_t*)a.v_cache + base);
        for (int64_t d = 0; d < hd; d += 2) {
          const __m512i w = _mm512_i32gather_epi32(idx, src + d / 2, 4);
          _mm256_storeu_si256((__m256i*)(vt + amx_vt_at(hd, j0, d)), _mm512_cvtepi32_epi16(w));
          _mm256_storeu_si256((__m256i*)(vt + amx_vt_at(hd, j0, d + 1)),
                              _mm512_cvtepi32_epi16(_mm512_srli_epi32(w, 16)));
        }
      } else {
        const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                               _mm512_set1_epi32((int)hd));
        const float* src = (const float*)a.v_cache + base;
        for (int64_t d = 0; d < hd; ++d)
          amx_store_bf16(vt + amx_vt_at(hd, j0, d), _mm512_i32gather_ps(idx, src + d, 4));
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
        vt[amx_vt_at(hd, j0 + j, d)] = (uint16_t)(u >> 16);
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

// Accumulators T0 += A_0 x (B_hi + B_lo) and T1 += A_1 x (B_hi + B_lo), with A_0 / A_1 already in tiles 4
// and 5, and the two 16 x 32 bf16 terms of B (rows 64 bytes apart) loaded into tiles 6 and 7. Each
// accumulator takes the hi term, then the lo term. Macros: the tile intrinsics take their tile numbers
// as literal tokens.
#define FD_AMX_TWO_TERMS(T0, T1, b_hi, b_lo) \
  do {                                       \
    _tile_loadd(6, (b_hi), 64);              \
    _tile_loadd(7, (b_lo), 64);              \
    _tile_dpbf16ps(T0, 4, 6);                \
    _tile_dpbf16ps(T1, 5, 6);                \
    _tile_dpbf16ps(T0, 4, 7);                \
    _tile_dpbf16ps(T1, 5, 7);                \
  } while (0)

// Accumulators T0, T1 to [16][16] fp32 blocks at o0 and o1 (rows 64 bytes apart), then zeroed for their
// next use.
#define FD_AMX_STORE_PAIR(T0, T1, o0, o1) \
  do {                                    \
    _tile_stored(T0, (o0), 64);           \
    _tile_stored(T1, (o1), 64);           \
    _tile_zero(T0);                       \
    _tile_zero(T1);                       \
  } while (0)

// One lane group's online-softmax state: 16 rows in the lanes.
struct AmxGroup {
  vf limit, mx, l;
  int64_t nk, min_nk;  // the most and the fewest keys of its rows
};

// Q^T's two terms for up to 16 rows (idle lanes repeat the last): q * scale * log2(e) split into hi
// (truncated) and lo, each [hd / 2][16 lanes][2]; and the group's state before its first chunk. 16 dims
// at a time are transposed in registers (lane r: row r), then split pair by pair as P^T is.
static void amx_q_terms(const AttnArgs& a, const AttnRow* rows, int64_t nrows, uint16_t* qt_hi, uint16_t* qt_lo,
                        AmxGroup& st) {
  const int64_t hd = a.head_dim;
  const float* qp[16];
  alignas(64) float lim[16];
  st.nk = 0;
  st.min_nk = INT64_MAX;
  for (int64_t r = 0; r < 16; ++r) {
    const AttnRow& row = rows[std::min(r, nrows - 1)];
    qp[r] = a.q + (row.token * a.num_heads + row.head) * hd;
    lim[r] = (float)(row.nk - 1);
    st.nk = std::max(st.nk, row.nk);
    st.min_nk = std::min(st.min_nk, row.nk);
  }
  const vf qscale = vset1(a.scale * kLog2e);
  for (int64_t d0 = 0; d0 < hd; d0 += 16) {
    vf m[16];
    for (int r = 0; r < 16; ++r) m[r] = vmul(vload(qp[r] + d0), qscale);
    amx_transpose16(m);
    for (int i = 0; i < 16; i += 2) {
      __m512i hi, lo;
      amx_split_pair(m[i], m[i + 1], hi, lo);
      _mm512_store_si512(qt_hi + (d0 + i) * 16, hi);
      _mm512_store_si512(qt_lo + (d0 + i) * 16, lo);
    }
  }
  st.limit = vload(lim);
  st.mx = vset1(-INFINITY);
  st.l = vzero();
}

// A lane's running max moves only when a chunk's maximum exceeds it by more than kAmxLazyMax (base-2
// units): the weights 2^(s - mx) are then at most 2^kAmxLazyMax, far from fp32's range, and a chunk that
// leaves every lane's max in place rescales by exactly 1 (vexp2_nonpos(0) == 1), so out^T's accumulators
// take its P.V without a vector pass. Which max a lane uses changes only roundings: the softmax is the same
// function of the scores for any reference value.
constexpr float kAmxLazyMax = 8.0f;

// One chunk's softmax for a lane group: scores^T s ([kAmxKeys][16]) of keys k0 .. k0 + n, masked past each
// lane's limit, into P^T's two terms (pair layout, keys n .. kend weigh 0). corr is the factor by which
// out^T's previous value is rescaled; returns the lanes whose max moved (corr != 1 only there).
static inline __mmask16 amx_softmax(const float* s, uint16_t* pt_hi, uint16_t* pt_lo, AmxGroup& st, int64_t k0,
                                    int64_t n, int64_t kend, vf& corr) {
  // Keys from min_nk on lie past some lane's limit (the diagonal chunk): masked to -inf, whose 2^x is 0.
  const int64_t unmasked = std::max<int64_t>(0, std::min(n, st.min_nk - k0));
  auto score = [&](int64_t j) {
    const vf x = vload(s + 16 * j);
    return j < unmasked ? x : vmask_le(x, (float)(k0 + j), st.limit);
  };
  // Key j's weight 2^t, t = score - mx <= kAmxLazyMax, by vexp2_scalef (vexp.h: vexp2_unit's relative
  // error ~1.5e-7, 2^floor(t) exact for any sign). A masked key's t = -inf (whose f would be NaN) is
  // clamped at -1000 first: its weight is 0. (corr keeps vexp2_nonpos: its value at 0 is exactly 1, which
  // the unmoved lanes need.)
  auto weight = [&](int64_t j, vf mx) {
    vf t = vsub(score(j), mx);
    if (j >= unmasked) t = vmax(t, vset1(-1000.0f));
    return vexp2_scalef(t);
  };
  // Two keys at a time, straight into P^T's pair layout; returns their sum.
  auto weights = [&](vf mx) {
    vf psum = vzero();
    for (int64_t j = 0; j < kend; j += 2) {
      const vf p0 = j < n ? weight(j, mx) : vzero();
      const vf p1 = j + 1 < n ? weight(j + 1, mx) : vzero();
      psum = vadd(vadd(psum, p0), p1);
      __m512i hi, lo;
      amx_split_pair(p0, p1, hi, lo);
      _mm512_storeu_si512(pt_hi + j * 16, hi);
      _mm512_storeu_si512(pt_lo + j * 16, lo);
    }
    return psum;
  };
  // A chunk after the first (masked keys and keys past n weigh 0 in both forms): the weights against the
  // current max first. A lane whose max would move has a score s > fl(mx + kAmxLazyMax), so s - mx >= 8
  // (rounded: still >= 8), a weight >= 2^8 (1 - 1.5e-7) > 255, and a chunk sum (of weights >= 0) at
  // least that. So where no lane's sum passes 255 (the usual case) no max moves: these are the weights
  // the two-pass form below would make, bit for bit, with corr exactly 1, and its max pass is saved.
  // Otherwise the two-pass form decides (and may find that no lane moved).
  if (k0 > 0) {
    const vf psum = weights(st.mx);
    if (!_mm512_cmp_ps_mask(psum, vset1(255.0f), _CMP_GT_OQ)) {
      corr = vset1(1.0f);
      st.l = vfma(st.l, corr, psum);
      return 0;
    }
  }
  // The row maxima over four independent chains (max is exact, so the order does not matter): one chain
  // would wait a vmax latency per key.
  vf m4[4] = {st.mx, st.mx, st.mx, st.mx};
  int64_t j = 0;
  for (; j + 4 <= unmasked; j += 4)
    for (int i = 0; i < 4; ++i) m4[i] = vmax(m4[i], vload(s + 16 * (j + i)));
  for (; j < n; ++j) m4[j % 4] = vmax(m4[j % 4], score(j));
  const vf cmax = vmax(vmax(m4[0], m4[1]), vmax(m4[2], m4[3]));
  // On the first chunk mx = -inf: every lane takes its chunk maximum and corr is 0.
  const __mmask16 moved = _mm512_cmp_ps_mask(cmax, vadd(st.mx, vset1(kAmxLazyMax)), _CMP_GT_OQ);
  const vf mx = _mm512_mask_blend_ps(moved, st.mx, cmax);
  corr = vexp2_nonpos(vsub(st.mx, mx));
  const vf psum = weights(mx);
  st.l = vfma(st.l, corr, psum);
  st.mx = mx;
  return moved;
}

// G groups of up to 16 rows of one KV head's GQA group (rows 16 g .. 16 g + 15 in group g's lanes; idle
// lanes repeat the group's last row), hd % 64 == 0. Two groups read each K and V^T tile once for 32 rows.
// The calling thread has run load_amx_tile_config.
template <int G>
static void attend_amx_groups(const AttnArgs& a, const AmxKv& kv, const AttnRow* rows, int64_t nrows) {
  const int64_t hd = a.head_dim;
  alignas(64) uint16_t qt[G][2][kMaxHeadDim * 16];  // Q^T's hi and lo terms per group
  alignas(64) float s[2][G][kAmxKeys * 16];          // scores^T: this chunk's, the next chunk's
  alignas(64) uint16_t pt[G][2][kAmxKeys * 16];      // P^T's hi and lo terms: [keys / 2][16 lanes][2]
  alignas(64) float ot[G][kMaxHeadDim * 16];
  AmxGroup st[G];
  int64_t nk = 0;
  // The rows' output lines are written only at the end, in one burst of hd / 16 lines a row: asked for
  // in writable state now, their misses overlap the chunks instead of filling the store buffer there.
  for (int64_t r = 0; r < nrows; ++r)
    for (int64_t d = 0; d < hd; d += 16)
      _mm_prefetch((const char*)(a.out + (rows[r].token * a.num_heads + rows[r].head) * hd + d), _MM_HINT_ET0);
  for (int g = 0; g < G; ++g) {
    amx_q_terms(a, rows + 16 * g, std::min<int64_t>(16, nrows - 16 * g), qt[g][0], qt[g][1], st[g]);
    nk = std::max(nk, st[g].nk);
  }
  _tile_zero(0);  // each store leaves its accumulators zeroed
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  // Scores^T of keys k0 + 32 h .. k0 + 32 h + 31: group g into accumulators 2 g, 2 g + 1 (G == 2), or both
  // halves of group 0 at once, half h into 2 h, 2 h + 1 (G == 1). Each accumulator takes the dims in
  // order, each dim step its hi then its lo term.
  auto scores_issue = [&](int64_t k0, int64_t h) {
    for (int64_t d = 0; d < hd; d += 32) {
      _tile_loadd(4, kv.k + amx_k_at(hd, k0 + 32 * h, d), 64);
      _tile_loadd(5, kv.k + amx_k_at(hd, k0 + 32 * h + 16, d), 64);
      if (G == 2 || h == 0) {
        FD_AMX_TWO_TERMS(0, 1, qt[0][0] + d * 16, qt[0][1] + d * 16);
      } else {
        FD_AMX_TWO_TERMS(2, 3, qt[0][0] + d * 16, qt[0][1] + d * 16);
      }
      if constexpr (G == 2) FD_AMX_TWO_TERMS(2, 3, qt[G - 1][0] + d * 16, qt[G - 1][1] + d * 16);
    }
  };
  auto scores_store = [&](float (*sb)[kAmxKeys * 16], int64_t h) {
    if (G == 2 || h == 0) {
      FD_AMX_STORE_PAIR(0, 1, sb[0] + 512 * h, sb[0] + 512 * h + 256);
    } else {
      FD_AMX_STORE_PAIR(2, 3, sb[0] + 512, sb[0] + 768);
    }
    if constexpr (G == 2) FD_AMX_STORE_PAIR(2, 3, sb[G - 1] + 512 * h, sb[G - 1] + 512 * h + 256);
  };
  // The whole chunk at k0: both halves, or only the first if the chunk has at most 32 keys (the last): the
  // upper half's scores are never read and its weights are 0, so nothing else changes.
  const auto halves = [&](int64_t k0) { return nk - k0 <= 32 ? 1 : 2; };
  for (int64_t h = 0; h < halves(0); ++h) {
    scores_issue(0, h);
    scores_store(s[0], h);
  }
  // Software-pipelined: the tiles compute the next chunk's scores while the vector units run this chunk's
  // softmax. Per lane the arithmetic and its order are those of the plain loop (scores, softmax, out^T *=
  // corr where the lane's max moved, out^T += P.V in the tiles), and each lane's only depend on its own
  // row: whether another lane of the tile moved its max only decides whether the rescale pass runs, which
  // multiplies the unmoved lanes by exactly 1. A row's result does not depend on the rows beside it.
  for (int64_t k0 = 0, cur = 0; k0 < nk; k0 += kAmxKeys, cur ^= 1) {
    const bool more = k0 + kAmxKeys < nk;
    const int64_t n = std::min<int64_t>(kAmxKeys, nk - k0), kend = n <= 32 ? 32 : kAmxKeys;
    const int64_t next_halves = more ? halves(k0 + kAmxKeys) : 0;
    vf corr[G];
    __mmask16 moved[G];
    if constexpr (G == 2) {
      if (next_halves > 0) scores_issue(k0 + kAmxKeys, 0);
      moved[0] = amx_softmax(s[cur][0], pt[0][0], pt[0][1], st[0], k0, n, kend, corr[0]);
      if (next_halves > 0) scores_store(s[cur ^ 1], 0);
      if (next_halves > 1) scores_issue(k0 + kAmxKeys, 1);
      moved[1] = amx_softmax(s[cur][1], pt[1][0], pt[1][1], st[1], k0, n, kend, corr[1]);
      if (next_halves > 1) scores_store(s[cur ^ 1], 1);
    } else {
      for (int64_t h = 0; h < next_halves; ++h) scores_issue(k0 + kAmxKeys, h);
      moved[0] = amx_softmax(s[cur][0], pt[0][0], pt[0][1], st[0], k0, n, kend, corr[0]);
      for (int64_t h = 0; h < next_halves; ++h) scores_store(s[cur ^ 1], h);
    }
    // out^T is all zeros before the first chunk: its accumulators start from the zeroed tiles.
    for (int g = 0; g < G && k0 > 0; ++g)
      if (moved[g])
        for (int64_t d = 0; d < hd; ++d) vstore(ot[g] + d * 16, vmul(vload(ot[g] + d * 16), corr[g]));
    // out^T's dims d0 .. d0 + 31: group g's in accumulators 2 g, 2 g + 1, each taking the keys in order,
    // each 32-key step its hi then its lo term.
    for (int64_t d0 = 0; d0 < hd; d0 += 32) {
      if (k0 > 0) {
        _tile_loadd(0, ot[0] + d0 * 16, 64);
        _tile_loadd(1, ot[0] + (d0 + 16) * 16, 64);
        if constexpr (G == 2) {
          _tile_loadd(2, ot[G - 1] + d0 * 16, 64);
          _tile_loadd(3, ot[G - 1] + (d0 + 16) * 16, 64);
        }
      }
      for (int64_t kt = 0; kt < kend; kt += 32) {
        _tile_loadd(4, kv.vt + amx_vt_at(hd, k0 + kt, d0), 64);
        _tile_loadd(5, kv.vt + amx_vt_at(hd, k0 + kt, d0 + 16), 64);
        FD_AMX_TWO_TERMS(0, 1, pt[0][0] + kt * 16, pt[0][1] + kt * 16);
        if constexpr (G == 2) FD_AMX_TWO_TERMS(2, 3, pt[G - 1][0] + kt * 16, pt[G - 1][1] + kt * 16);
      }
      FD_AMX_STORE_PAIR(0, 1, ot[0] + d0 * 16, ot[0] + (d0 + 16) * 16);
      if constexpr (G == 2) FD_AMX_STORE_PAIR(2, 3, ot[G - 1] + d0 * 16, ot[G - 1] + (d0 + 16) * 16);
    }
  }
  // out^T / l, transposed back 16 dims at a time: lane r's values go to row r's output.
  for (int g = 0; g < G; ++g) {
    const vf inv = _mm512_div_ps(vset1(1.0f), st[g].l);
    const int64_t ng = std::min<int64_t>(16, nrows - 16 * g);
    for (int64_t d0 = 0; d0 < hd; d0 += 16) {
      vf blk[16];
      for (int i = 0; i < 16; ++i) blk[i] = vmul(vload(ot[g] + (d0 + i) * 16), inv);
      amx_transpose16(blk);
      for (int64_t r = 0; r < ng; ++r) {
        const AttnRow& row = rows[16 * g + r];
        vstore(a.out + (row.token * a.num_heads + row.head) * hd + d0, blk[r]);
      }
    }
  }
}

// Up to 32 rows of one KV head's GQA group: two lane groups of 16, or one if there are at most 16.
static void attend_amx(const AttnArgs& a, const AmxKv& kv, const AttnRow* rows, int64_t nrows) {
  if (nrows > 16) {
    attend_amx_groups<2>(a, kv, rows, nrows);
  } else {
    attend_amx_groups<1>(a, kv, rows, nrows);
  }
}

#undef FD_AMX_STORE_PAIR
#undef FD_AMX_TWO_TERMS

#pragma GCC pop_options
