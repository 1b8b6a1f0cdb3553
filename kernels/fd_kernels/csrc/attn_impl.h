// Paged attention over the block-table KV cache, included by kern_impl.h inside an ISA namespace.
// Varlen batch: sequence b owns query tokens query_start_loc[b] .. query_start_loc[b+1]; query i sits at
// position seq_len - q_len + i and attends causally to keys 0..position through its block table.
//
// Work is split into (sequence, KV head, tile of rows), where a row is one (query, head) pair of the KV
// head's GQA group, so a tile's rows share every key and value they read. Tiles of >= kMinLaneRows rows
// (prefill) put rows in vector lanes: scores and the P x V update are plain FMAs with broadcast key/value
// elements, no horizontal sums. Smaller tiles (decode) take the keys chunk by chunk: dot products row by
// row (the group's heads read the chunk from L1 after the first one loads it), then one P x V pass that
// reads each value once for all rows (attend_rows); contexts over kKeysPerPart keys in parts that are
// separate work items, combined at the end (combine_parts).
//
// The cache holds fp32, bf16 (bf16_impl.h) or int8 codes with per-row scales (the C8 cache, c8_impl.h):
// the kernels are templates on the KvKind KV. The lane path widens / dequantizes each chunk of keys and
// values once into a small fp32 buffer that every row then reads. The decode path reads bf16 keys and
// values straight into registers (AVX-512: dots16_rows and pv_rows widen as they load, so it reads half the
// fp32 bytes and writes nothing); for C8 it folds the scales into the scores and probabilities.
// No include guard on purpose.

#include "bf16_impl.h"
#include "c8_impl.h"

constexpr int64_t kKeyChunk = 16;     // keys per online-softmax update (lanes), per sub-chunk (decode)
constexpr int64_t kDecodeChunk = 64;  // keys per online-softmax update on the decode path
constexpr int64_t kMaxHeadDim = 512;  // checked by the glue
constexpr float kLog2e = 1.4426950408889634f;  // softmax scores are scaled by it into base 2 (vexp2_nonpos)
constexpr int64_t kMinLaneRows = FD_W >= 8 ? FD_W / 2 : 4;  // below it lanes would idle
constexpr int64_t kDecodeRows = 16;  // rows per work item on the one-row-at-a-time path
// The most floats of keys (and as many of values) one thread converts for widen_kv: 4 MiB each, which its
// wide_scratch keeps.
constexpr int64_t kMaxWideFloats = int64_t{1} << 20;

struct AttnRow {
  int64_t token, head, nk;  // query token index in T, query head, keys it sees (position + 1)
};

// Pointer to the first of `n` consecutive keys starting at key kk (never crossing a block).
static inline int64_t key_base(const AttnArgs& a, const int64_t* bt, int64_t g, int64_t kk) {
  return ((bt[kk / a.block_size] * a.num_kv_heads + g) * a.block_size + kk % a.block_size) * a.head_dim;
}

// Bytes per cached element of a KV cache kind.
template <int KV>
constexpr int64_t kv_esize = KV == kKvS8 ? 1 : KV == kKvBF16 ? 2 : 4;

// Keys and values of the chunk of n rows at `base` as fp32: the cache itself, or widened (bf16) /
// dequantized (C8) into kbuf / vbuf. The scales share the cache's indexing without head_dim: row base / hd.
template <int KV>
static inline void chunk_kv(const AttnArgs& a, int64_t base, int64_t n, float* kbuf, float* vbuf,
                            const float*& kp, const float*& vp) {
  if constexpr (KV == kKvS8) {
    dequant_rows((const int8_t*)a.k_cache + base, a.k_scales + base / a.head_dim, n, a.head_dim, kbuf);
    dequant_rows((const int8_t*)a.v_cache + base, a.v_scales + base / a.head_dim, n, a.head_dim, vbuf);
    kp = kbuf;
    vp = vbuf;
  } else if constexpr (KV == kKvBF16) {
    widen_bf16((const uint16_t*)a.k_cache + base, n * a.head_dim, kbuf);
    widen_bf16((const uint16_t*)a.v_cache + base, n * a.head_dim, vbuf);
    kp = kbuf;
    vp = vbuf;
  } else {
    kp = (const float*)a.k_cache + base;
    vp = (const float*)a.v_cache + base;
  }
}

static inline int64_t chunk_len(const AttnArgs& a, int64_t kk, int64_t nk) {
  return std::min(std::min(a.block_size - kk % a.block_size, nk - kk), kKeyChunk);
}

// ------------------------------------------------------------------------------------------- decode
// A few rows (decode: the GQA group's heads of one query) that share every key and value they read.
// Per chunk of keys: every row's raw scores (fp32 / bf16 on AVX-512: dots16_rows, each key vector loaded
// once for up to three rows, bf16 widened in registers as it loads; AVX2: dots8_rows, the same, four keys
// at a time; elsewhere dot products row by row, bf16 widened once per chunk into kbuf; C8 on AVX-512:
// the codes transposed so the keys sit in lanes, c8_scores16), then each row's online-softmax update (one
// vector of 16 scores on AVX-512), then one P x V pass for all rows, which loads (bf16: widens, C8:
// converts) each value vector once and feeds every row's accumulators from it. C8 folds the per-row scales
// into the scores (k scale) and the probabilities (v scale): the codes are only converted to fp32, never
// multiplied per element.

// FD_W cached values at element offset off of an fp32 or bf16 cache (or C8 codes, unscaled) as fp32;
// kv_at: one of them.
template <int KV>
static inline vf load_kv(const void* p, int64_t off) {
  if constexpr (KV == kKvS8) {
    return vload_s8((const int8_t*)p + off);
  } else if constexpr (KV == kKvBF16) {
    return vload_bf16((const uint16_t*)p + off);
  } else {
    return vload((const float*)p + off);
  }
}

template <int KV>
static inline float kv_at(const void* p, int64_t off) {
  if constexpr (KV == kKvS8) {
    return (float)((const int8_t*)p)[off];
  } else if constexpr (KV == kKvBF16) {
    return bf16_float(((const uint16_t*)p)[off]);
  } else {
    return ((const float*)p)[off];
  }
}

// 2 * FD_W consecutive bf16 values at p as fp32: e the even-indexed ones, o the odd-indexed ones. Each
// 32-bit lane holds a pair, so a shift and a mask widen them: no shuffles (vload_bf16's zero-extension is
// one per vector). The decode path keeps its bf16 operands in this order (kv_pairs_dims).
static inline void vload_bf16_eo(const uint16_t* p, vf& e, vf& o) {
#if FD_W == 16
  const __m512i x = _mm512_loadu_si512(p);
  e = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
  o = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32((int)0xFFFF0000u)));
#elif FD_W == 8
  const __m256i x = _mm256_loadu_si256((const __m256i*)p);
  e = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
  o = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32((int)0xFFFF0000u)));
#else
  e = bf16_float(p[0]);
  o = bf16_float(p[1]);
#endif
}

// The decode path's accumulators over a bf16 cache hold dims [0, hdp) in pairs of vectors: the even dims
// of each 2 * FD_W block, then its odd dims (vload_bf16_eo's order); hdp is what pv_rows' DB-vector passes
// cover. kv_pairs_dims: hdp (0 for other caches); kv_pairs_natural: one row back into dim order.
template <int KV>
static inline int64_t kv_pairs_dims(int64_t hd) {
  constexpr int64_t db = FD_W == 16 ? 4 : 2;  // pv_rows' DB
  return KV == kKvBF16 ? hd / (db * FD_W) * (db * FD_W) : 0;
}

static inline void kv_pairs_natural(float* x, int64_t hdp) {
  float t[2 * FD_W];
  for (int64_t d0 = 0; d0 < hdp; d0 += 2 * FD_W) {
    for (int i = 0; i < FD_W; ++i) {
      t[2 * i] = x[d0 + i];
      t[2 * i + 1] = x[d0 + FD_W + i];
    }
    std::memcpy(x + d0, t, sizeof(t));
  }
}

// Where the decode path's 16-key sub-chunk prefetches go when the scores issue them (AVX-512: fp32, bf16
// or C8 cache; AVX2: fp32 or bf16): the next sub-chunk's keys and values into L1 (k0, v0) and those a
// chunk ahead into L2 (k1, v1), each the same byte layout as the sub-chunk being scored. A target with
// nothing to fetch points at that sub-chunk itself. AVX2 (dots8_rows) leaves v1 to the P x V pass
// (pv_rows' pfv), which spreads the chunk's far prefetches over both halves of its work.
struct SubPrefetch {
  const char *k0, *v0, *k1, *v1;
};

#if FD_W == 16
// q of one row in the order dots16_rows reads it: per 16 dims the 8 even ones, then the 8 odd ones.
static inline void q_pairs16(const float* q, int64_t hd, float* qx) {
  const __m512i eo = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  for (int64_t d = 0; d < hd; d += 16) _mm512_storeu_ps(qx + d, _mm512_permutexvar_ps(eo, _mm512_loadu_ps(q + d)));
}

// Raw scores of R <= 3 rows (qx: a GQA group's heads, each in q_pairs16's order) against 16 keys of an fp32
// or bf16 cache (hd % 16 == 0; HD: hd as a constant, 0 for any), into sc rows kDecodeChunk apart. Each key
// vector holds two keys, 8 dims of each: per 16 dims, the even ones, then the odd ones (bf16: one 256-bit
// insert puts 16 dims of each key in one register, a shift and a mask widen the even and the odd ones;
// fp32: two two-source permutes). So a row's 4 accumulators hold 8 keys, 8 lanes a key, R * 4 of them and
// 2R query vectors fit the registers, and the 16 keys go in two halves of 8. A 3-level tree of shuffle
// pairs folds each row's 8 accumulators straight into its 16 scores: half the folding of one key per
// vector. Half h's accumulator j pairs keys 2h + (j & 1) + 8 (j >> 1) and that + 4, which makes the tree's
// output come out in key order. Each lane sums its hd / 8 dims in the same order for either cache, so the
// bf16 scores equal the fp32 kernel's on the widened keys.
// pf (optional): a line of each prefetch target at every line of the sub-chunk as the keys are read, so the
// prefetches spread over the scores instead of leaving in a burst that fills the line fill buffers.
template <int R, int KV, int HD>
static inline void dots16_rows(const float* const* qx, const void* kp, int64_t hd_arg, float* sc,
                               const SubPrefetch* pf) {
  constexpr int64_t esize = kv_esize<KV>;  // fp32 or bf16 here
  const int64_t hd = HD ? HD : hd_arg;
  const __m512i hi = _mm512_set1_epi32((int)0xFFFF0000u);
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  const SubPrefetch t = pf ? *pf : SubPrefetch{};  // in registers: the asm operands made GCC reload *pf
  __m512 u[2][R];  // each half's sums after two levels of the tree
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    __m512 acc[R][4];
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int64_t d = 0; d < hd; d += 16) {
      int64_t hs = hd;  // a runtime hd opaque at each step: no per-key pointers strength-reduced (spills)
      if constexpr (HD == 0) asm("" : "+r"(hs));
      __m512 qe[R], qo[R];  // the even / odd dims of d .. d + 15 in both 256-bit halves
      for (int r = 0; r < R; ++r) {
        qe[r] = _mm512_broadcast_f32x8(_mm256_loadu_ps(qx[r] + d));
        qo[r] = _mm512_broadcast_f32x8(_mm256_loadu_ps(qx[r] + d + 8));
      }
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        const int64_t ka = 2 * h + (j & 1) + 8 * (j >> 1), kb = ka + 4;
        if (pf) {
#pragma GCC unroll 2
          for (int64_t k = ka; k <= kb; k += 4) {
            if (const int64_t e = (k * hs + d) * esize; e % 64 == 0) {
              asm volatile("prefetcht0 %0" : : "m"(t.k0[e]));
              asm volatile("prefetcht0 %0" : : "m"(t.v0[e]));
              asm volatile("prefetcht1 %0" : : "m"(t.k1[e]));
              asm volatile("prefetcht1 %0" : : "m"(t.v1[e]));
            }
          }
        }
        __m512 ke, ko;
        if constexpr (KV == kKvBF16) {  // each 32-bit lane a pair of dims: the high half is the odd one
          const uint16_t* k = (const uint16_t*)kp + d;
          const __m256i xa = _mm256_loadu_si256((const __m256i*)(k + ka * hs));
          const __m256i xb = _mm256_loadu_si256((const __m256i*)(k + kb * hs));
          const __m512i x = _mm512_inserti64x4(_mm512_castsi256_si512(xa), xb, 1);
          ke = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
          ko = _mm512_castsi512_ps(_mm512_and_si512(x, hi));
        } else {
          const float* k = (const float*)kp + d;
          const __m512 xa = _mm512_loadu_ps(k + ka * hs), xb = _mm512_loadu_ps(k + kb * hs);
          ke = _mm512_permutex2var_ps(xa, even, xb);
          ko = _mm512_permutex2var_ps(xa, odd, xb);
        }
        for (int r = 0; r < R; ++r) {
          acc[r][j] = _mm512_fmadd_ps(qe[r], ke, acc[r][j]);
          acc[r][j] = _mm512_fmadd_ps(qo[r], ko, acc[r][j]);
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      __m512 t2[2];
      for (int i = 0; i < 2; ++i)  // 128-bit quarters: the keys of acc i, acc i + 2, 4 partial sums each
        t2[i] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[r][i], acc[r][i + 2], 0x88),
                              _mm512_shuffle_f32x4(acc[r][i], acc[r][i + 2], 0xDD));
      // each quarter: 2 partial sums of t2[0]'s key there, then 2 of t2[1]'s
      u[h][r] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t2[0]), _mm512_castps_pd(t2[1]))),
                              _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t2[0]), _mm512_castps_pd(t2[1]))));
    }
  }
  for (int r = 0; r < R; ++r) {  // quarter q: keys 4q .. 4q + 3 (half 0's two, then half 1's)
    const __m512 a = _mm512_shuffle_ps(u[0][r], u[1][r], 0x88), b = _mm512_shuffle_ps(u[0][r], u[1][r], 0xDD);
    _mm512_storeu_ps(sc + r * kDecodeChunk, _mm512_add_ps(a, b));
  }
}

// hd 64 and 128 as constants: every key's offset is an immediate (hd 64: the loops unroll fully).
template <int R, int KV>
static inline void dots16_rows(const float* const* qx, const void* kp, int64_t hd, float* sc,
                               const SubPrefetch* pf) {
  if (hd == 64) {
    dots16_rows<R, KV, 64>(qx, kp, hd, sc, pf);
  } else if (hd == 128) {
    dots16_rows<R, KV, 128>(qx, kp, hd, sc, pf);
  } else {
    dots16_rows<R, KV, 0>(qx, kp, hd, sc, pf);
  }
}

// Raw scores of R rows (q pointers qr) against the C8 codes of 16 keys (hd % 16 == 0), into sc rows
// kDecodeChunk apart. The codes are transposed in registers so the keys sit in lanes and each row's 16 scores
// are plain FMAs with q[d] broadcast: no horizontal sums, and each code is converted to fp32 once for
// all R rows. Per 64 dims, each 128-bit lane of the 16 key rows is a 16 x 16 byte matrix that four
// rounds of unpacks (64 shuffles per KiB of codes) transpose; register i then holds dim bitrev4(i).
// pf (optional): as dots16_rows', a line of each prefetch target at every line of codes the loads start.
template <int R>
static inline void c8_scores16(const float* const* qr, const int8_t* kq, int64_t hd, float* sc,
                               const SubPrefetch* pf) {
  static constexpr int kBitrev4[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};
  alignas(64) int8_t t[16 * 64];
  const SubPrefetch pt = pf ? *pf : SubPrefetch{};  // in registers (dots16_rows)
  const float* q[R];
  for (int r = 0; r < R; ++r) q[r] = qr[r];
  __m512 acc[R][4];  // 4 FMA chains per row
  for (int i = 0; i < R; ++i)
    for (int c = 0; c < 4; ++c) acc[i][c] = _mm512_setzero_ps();
  for (int64_t d0 = 0; d0 < hd; d0 += 64) {
    const int64_t w = std::min<int64_t>(64, hd - d0);  // 16, 32, 48 or 64 dims
    const __mmask64 m = w == 64 ? ~0ull : (1ull << w) - 1;
    __m512i x[16], y[16];
    for (int j = 0; j < 16; ++j) {
      for (int64_t e = (j * hd + d0 + 63) / 64 * 64; pf && e < j * hd + d0 + w; e += 64) {  // lines it starts
        asm volatile("prefetcht0 %0" : : "m"(pt.k0[e]));
        asm volatile("prefetcht0 %0" : : "m"(pt.v0[e]));
        asm volatile("prefetcht1 %0" : : "m"(pt.k1[e]));
        asm volatile("prefetcht1 %0" : : "m"(pt.v1[e]));
      }
      x[j] = _mm512_maskz_loadu_epi8(m, kq + j * hd + d0);
    }
    for (int i = 0; i < 8; ++i) {
      y[i] = _mm512_unpacklo_epi8(x[2 * i], x[2 * i + 1]);
      y[i + 8] = _mm512_unpackhi_epi8(x[2 * i], x[2 * i + 1]);
    }
    for (int i = 0; i < 8; ++i) {
      x[i] = _mm512_unpacklo_epi16(y[2 * i], y[2 * i + 1]);
      x[i + 8] = _mm512_unpackhi_epi16(y[2 * i], y[2 * i + 1]);
    }
    for (int i = 0; i < 8; ++i) {
      y[i] = _mm512_unpacklo_epi32(x[2 * i], x[2 * i + 1]);
      y[i + 8] = _mm512_unpackhi_epi32(x[2 * i], x[2 * i + 1]);
    }
    for (int i = 0; i < 8; ++i) {
      x[i] = _mm512_unpacklo_epi64(y[2 * i], y[2 * i + 1]);
      x[i + 8] = _mm512_unpackhi_epi64(y[2 * i], y[2 * i + 1]);
    }
    for (int i = 0; i < 16; ++i) _mm512_store_si512((__m512i*)(t + i * 64), x[i]);
    for (int64_t lane = 0; lane < w / 16; ++lane) {
      const int8_t* tl = t + lane * 16;
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) {
        const int64_t d = d0 + 16 * lane + kBitrev4[i];
        const __m512 kv = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128((const __m128i*)(tl + i * 64))));
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) acc[r][i & 3] = _mm512_fmadd_ps(_mm512_set1_ps(q[r][d]), kv, acc[r][i & 3]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    _mm512_storeu_ps(sc + r * kDecodeChunk,
                     _mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]), _mm512_add_ps(acc[r][2], acc[r][3])));
}
#endif

#if FD_W == 8
// Raw scores of R <= 3 rows (q pointers qr) against n keys of an fp32 or bf16 cache at kp (hd % 8 == 0),
// into sc rows kDecodeChunk apart: four keys at a time, each key vector loaded (bf16: widened) once for
// all R rows, 4R accumulators folded into four sums per row by one hadd tree. A last key or three take
// the same chains one key at a time. The fp32 and bf16 caches share it, so the bf16 path sums in the fp32
// kernel's order (the bf16-vs-fp32 oracle in tests/kernels/test_attention.py).
// pf (optional): as dots16_rows' (n == kKeyChunk then), but for v1: pv_rows fetches those.
template <int R, int KV>
static inline void dots8_rows(const float* const* qr, const void* kp, int64_t n, int64_t hd, float* sc,
                              const SubPrefetch* pf) {
  constexpr int64_t esize = kv_esize<KV>;  // fp32 or bf16 here
  const SubPrefetch t = pf ? *pf : SubPrefetch{};  // in registers (dots16_rows)
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    if (pf)  // the lines that start among the four keys' bytes, before their FMAs
      for (int64_t e = (j * hd * esize + 63) / 64 * 64; e < (j + 4) * hd * esize; e += 64) {
        asm volatile("prefetcht0 %0" : : "m"(t.k0[e]));
        asm volatile("prefetcht0 %0" : : "m"(t.v0[e]));
        asm volatile("prefetcht1 %0" : : "m"(t.k1[e]));
      }
    __m256 acc[R][4];
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < 4; ++i) acc[r][i] = _mm256_setzero_ps();
    for (int64_t d = 0; d < hd; d += 8)
      for (int i = 0; i < 4; ++i) {
        const __m256 kv = load_kv<KV>(kp, (j + i) * hd + d);
        for (int r = 0; r < R; ++r) acc[r][i] = _mm256_fmadd_ps(_mm256_loadu_ps(qr[r] + d), kv, acc[r][i]);
      }
    for (int r = 0; r < R; ++r) {
      // hadd(hadd(a0, a1), hadd(a2, a3)): each 128-bit half holds the four keys' partial sums.
      const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(acc[r][0], acc[r][1]), _mm256_hadd_ps(acc[r][2], acc[r][3]));
      _mm_storeu_ps(sc + r * kDecodeChunk + j, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
    }
  }
  for (; j < n; ++j)
    for (int r = 0; r < R; ++r) {
      __m256 acc = _mm256_setzero_ps();
      for (int64_t d = 0; d < hd; d += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(qr[r] + d), load_kv<KV>(kp, j * hd + d), acc);
      sc[r * kDecodeChunk + j] = vhsum(acc);
    }
}
#endif

// The first lane of a vector.
static inline float vfirst(vf v) {
#if FD_W == 16
  return _mm512_cvtss_f32(v);
#elif FD_W == 8
  return _mm256_cvtss_f32(v);
#else
  return v;
#endif
}

// Online-softmax update of one row over its raw dot products sc[0..n) (n <= kDecodeChunk), in base 2: the
// scores are t_j = sc_j * scale2 (scale2 = softmax scale * log2 e; C8: times the key's scale ks_j) and
// probabilities 2^(t_j - mx) (vexp2_nonpos), so mx is the running max of t. One max and one rescale per
// chunk; the row's sum stays in FD_W partial sums lv (rescaled with the accumulator, added up once at the
// end). On return sc[j] holds key j's probability (C8: times its value scale vs_j) for j < n, 0 from n to
// the end of n's last vector, and corr the factor the accumulator must be rescaled by: exactly 1 while
// the running max stands, 0 on the row's first chunk. ks / vs: the chunk's C8 scales, else unused.
template <bool C8>
static inline void softmax_update(float* sc, int64_t n, float scale2, const float* ks, const float* vs, float& mx,
                                  float* lv, float& corr) {
  const int64_t nv = (n + FD_W - 1) / FD_W;
  for (int64_t v = 0; v < nv; ++v) {
    vf s = vmul(vload(sc + v * FD_W), vset1(scale2));
    if constexpr (C8) s = vmul(s, vload(ks + v * FD_W));
    vstore(sc + v * FD_W, s);
  }
  for (int64_t j = n; j < nv * FD_W; ++j) sc[j] = -INFINITY;  // after the scales: -inf * 0 would be NaN
  vf m = vload(sc);
  for (int64_t v = 1; v < nv; ++v) m = vmax(m, vload(sc + v * FD_W));
  const float cmax = std::max(mx, vhmax(m));
  corr = cmax == mx ? 1.0f : mx == -INFINITY ? 0.0f : vfirst(vexp2_nonpos(vset1(mx - cmax)));
  mx = cmax;
  vf sum = vzero();
  for (int64_t v = 0; v < nv; ++v) {
    vf p = vexp2_nonpos(vsub(vload(sc + v * FD_W), vset1(cmax)));
    sum = vadd(sum, p);
    if constexpr (C8) p = vmul(p, vload(vs + v * FD_W));
    vstore(sc + v * FD_W, p);
  }
  vstore(lv, corr == 1.0f ? vadd(vload(lv), sum) : vfma(vload(lv), vset1(corr), sum));
}

// acc[r] = acc[r] * corr[r] + sum_j p[r][j] * v_j for R rows (acc rows kMaxHeadDim apart, p rows
// kDecodeChunk apart) over a chunk's keys: sub-chunk i is keys off[i] .. off[i + 1] of the chunk, its values
// at vp[i] (fp32, bf16, or C8 codes whose scales p already holds). Each value vector is loaded (widened /
// converted) once for all R rows; DB vectors per pass keep R * DB FMA chains going over the whole chunk. Over
// a bf16 cache the passes read even / odd halves, so acc holds [0, kv_pairs_dims) in pairs order.
// pfv (optional): per sub-chunk, values in its byte layout to prefetch (SubPrefetch's v1), at each key's
// values of every pass (a line can take several: docs/kernels-measurements.md, avx2-dattn), so the far
// values stream in during P x V instead of adding to the scores' burst.
template <int R, int KV>
static inline void pv_rows(float* acc, const float* p, const float* corr, const void* const* vp, const int64_t* off,
                           int64_t nsub, int64_t hd, const char* const* pfv = nullptr) {
  constexpr int DB = FD_W == 16 ? 4 : 2;  // R * DB accumulators + DB values + R broadcasts in registers
  static_assert(DB % 2 == 0, "bf16 values come in even / odd pairs of vectors");
  constexpr int64_t esize = kv_esize<KV>;
  int64_t d = 0;
  for (; d + DB * FD_W <= hd; d += DB * FD_W) {
    vf o[R][DB];
    for (int r = 0; r < R; ++r)
      for (int b = 0; b < DB; ++b) o[r][b] = vmul(vload(acc + r * kMaxHeadDim + d + b * FD_W), vset1(corr[r]));
    for (int64_t i = 0; i < nsub; ++i)
      for (int64_t j = off[i]; j < off[i + 1]; ++j) {
        if (pfv) asm volatile("prefetcht1 %0" : : "m"(pfv[i][((j - off[i]) * hd + d) * esize]));
        vf v[DB];
        if constexpr (KV == kKvBF16) {  // pairs order: kv_pairs_dims
          for (int b = 0; b < DB; b += 2)
            vload_bf16_eo((const uint16_t*)vp[i] + (j - off[i]) * hd + d + b * FD_W, v[b], v[b + 1]);
        } else {
          for (int b = 0; b < DB; ++b) v[b] = load_kv<KV>(vp[i], (j - off[i]) * hd + d + b * FD_W);
        }
        for (int r = 0; r < R; ++r) {
          const vf pj = vset1(p[r * kDecodeChunk + j]);
          for (int b = 0; b < DB; ++b) o[r][b] = vfma(pj, v[b], o[r][b]);
        }
      }
    for (int r = 0; r < R; ++r)
      for (int b = 0; b < DB; ++b) vstore(acc + r * kMaxHeadDim + d + b * FD_W, o[r][b]);
  }
  for (; d + FD_W <= hd; d += FD_W) {
    vf o[R];
    for (int r = 0; r < R; ++r) o[r] = vmul(vload(acc + r * kMaxHeadDim + d), vset1(corr[r]));
    for (int64_t i = 0; i < nsub; ++i)
      for (int64_t j = off[i]; j < off[i + 1]; ++j) {
        const vf v = load_kv<KV>(vp[i], (j - off[i]) * hd + d);
        for (int r = 0; r < R; ++r) o[r] = vfma(vset1(p[r * kDecodeChunk + j]), v, o[r]);
      }
    for (int r = 0; r < R; ++r) vstore(acc + r * kMaxHeadDim + d, o[r]);
  }
  for (; d < hd; ++d)
    for (int r = 0; r < R; ++r) {
      float o = acc[r * kMaxHeadDim + d] * corr[r];
      for (int64_t i = 0; i < nsub; ++i)
        for (int64_t j = off[i]; j < off[i + 1]; ++j)
          o += p[r * kDecodeChunk + j] * kv_at<KV>(vp[i], (j - off[i]) * hd + d);
      acc[r * kMaxHeadDim + d] = o;
    }
}

// Raw scores of the rows against one sub-chunk of n <= kKeyChunk keys (inside one block) whose keys sit
// at kc as cached, into p rows kDecodeChunk apart. whole16: 16-key sub-chunks on AVX-512 (they may read
// all 16 rows of a partial last one: rows past the context are in the cache, stale, and the softmax masks
// their scores out). kbuf: kKeyChunk * hd floats of scratch. qx: the rows' q in q_pairs16's order where
// dots16_rows reads them (fp32 / bf16 cache, whole16), else qr.
template <int KV>
static inline void score_rows(const float* const* qr, const float* const* qx, int64_t nrows, const void* kc,
                              int64_t n, int64_t hd, bool whole16, float* kbuf, float* p, const SubPrefetch* pf) {
#if FD_W == 16
  if (whole16) {
    if constexpr (KV == kKvS8) {
      for (int64_t r = 0; r < nrows; r += 4) {
        float* pr = p + r * kDecodeChunk;
        switch (std::min<int64_t>(4, nrows - r)) {
          case 4: c8_scores16<4>(qr + r, (const int8_t*)kc, hd, pr, r == 0 ? pf : nullptr); break;
          case 3: c8_scores16<3>(qr + r, (const int8_t*)kc, hd, pr, r == 0 ? pf : nullptr); break;
          case 2: c8_scores16<2>(qr + r, (const int8_t*)kc, hd, pr, r == 0 ? pf : nullptr); break;
          default: c8_scores16<1>(qr + r, (const int8_t*)kc, hd, pr, r == 0 ? pf : nullptr);
        }
      }
    } else {
      for (int64_t r = 0; r < nrows; r += 3) {
        float* pr = p + r * kDecodeChunk;
        switch (std::min<int64_t>(3, nrows - r)) {
          case 3: dots16_rows<3, KV>(qx + r, kc, hd, pr, r == 0 ? pf : nullptr); break;
          case 2: dots16_rows<2, KV>(qx + r, kc, hd, pr, r == 0 ? pf : nullptr); break;
          default: dots16_rows<1, KV>(qx + r, kc, hd, pr, r == 0 ? pf : nullptr);
        }
      }
    }
    return;
  }
#endif
#if FD_W == 8
  if constexpr (KV != kKvS8) {
    if (hd % 8 == 0) {
      for (int64_t r = 0; r < nrows; r += 3) {
        float* pr = p + r * kDecodeChunk;
        switch (std::min<int64_t>(3, nrows - r)) {
          case 3: dots8_rows<3, KV>(qr + r, kc, n, hd, pr, r == 0 ? pf : nullptr); break;
          case 2: dots8_rows<2, KV>(qr + r, kc, n, hd, pr, r == 0 ? pf : nullptr); break;
          default: dots8_rows<1, KV>(qr + r, kc, n, hd, pr, r == 0 ? pf : nullptr);
        }
      }
      return;
    }
  }
#endif
  const float* kp = (const float*)kc;
  if constexpr (KV == kKvS8) {  // codes to fp32, unscaled
    const int8_t* kq = (const int8_t*)kc;
    int64_t e = 0;
    for (; e + FD_W <= n * hd; e += FD_W) vstore(kbuf + e, vload_s8(kq + e));
    for (; e < n * hd; ++e) kbuf[e] = (float)kq[e];
    kp = kbuf;
  } else if constexpr (KV == kKvBF16) {  // widened once for all rows
    widen_bf16((const uint16_t*)kc, n * hd, kbuf);
    kp = kbuf;
  }
  for (int64_t r = 0; r < nrows; ++r)
    for (int64_t j = 0; j < n; ++j) p[r * kDecodeChunk + j] = dot(qr[r], kp + j * hd, hd);
}

// A decode row's result from its state: acc (pairs order, kv_pairs_dims), partial sums lv, running max mx.
// With st == nullptr the output goes to a.out; else the unnormalized state to st: acc[hd], mx, sum.
template <int KV>
static inline void finish_row(const AttnArgs& a, const AttnRow& row, float* acc, const float* lv, float mx,
                              float* st) {
  const int64_t hd = a.head_dim;
  const float l = vhsum(vload(lv));
  kv_pairs_natural(acc, kv_pairs_dims<KV>(hd));
  if (st) {
    std::memcpy(st, acc, hd * sizeof(float));
    st[hd] = mx;
    st[hd + 1] = l;
    return;
  }
  float* op = a.out + (row.token * a.num_heads + row.head) * hd;
  for (int64_t d = 0; d < hd; ++d) op[d] = acc[d] / l;
}

// Prefetches the keys and values [k0, k1) of KV head g, block by block (the block table decides where each
// block sits, so the hardware prefetcher cannot follow), into L1 (L1 true) or L2.
template <int KV, bool L1>
static inline void prefetch_keys(const AttnArgs& a, const int64_t* bt, int64_t g, int64_t k0, int64_t k1) {
  constexpr int64_t esize = kv_esize<KV>;
  for (int64_t kk = k0; kk < k1;) {
    const int64_t len = std::min(a.block_size - kk % a.block_size, k1 - kk);
    const int64_t nb = key_base(a, bt, g, kk) * esize, bytes = len * a.head_dim * esize;
    // asm volatile: GCC 12 deleted a loop of _mm_prefetch calls in such a helper as a loop without side
    // effects.
    for (int64_t o = 0; o < bytes; o += 64) {
      if constexpr (L1) {
        asm volatile("prefetcht0 %0" : : "m"(*((const char*)a.k_cache + nb + o)));
        asm volatile("prefetcht0 %0" : : "m"(*((const char*)a.v_cache + nb + o)));
      } else {
        asm volatile("prefetcht1 %0" : : "m"(*((const char*)a.k_cache + nb + o)));
        asm volatile("prefetcht1 %0" : : "m"(*((const char*)a.v_cache + nb + o)));
      }
    }
    kk += len;
  }
}

// The keys [k0, nk) of KV head g of a sequence (block table bt): the work item a thread takes next.
struct NextKeys {
  const int64_t* bt;
  int64_t g, k0, nk;
};

// Keys [k0, k1) of the rows (each also limited by its own nk). With part == nullptr the rows' outputs go
// to a.out; else each row's unnormalized state goes to part + r * (hd + 2): acc[hd], running max (base 2,
// as softmax_update keeps it), sum (max -inf and sum 0 for a row with no keys in the range), for
// combine_parts. next: the item the calling thread takes after this one (nullptr: unknown, or another
// thread may take it, whose core would then read the lines out of this core's L2). The L2 prefetch a chunk
// ahead runs on past this item's last key into next's first keys, as one stream, so that item finds its
// first chunk in L2 instead of starting on misses. warm: how many of this item's first keys the previous
// item prefetched that way (its start skips their L2 prefetch). Returns the warm of next.
template <int KV>
static int64_t attend_rows(const AttnArgs& a, const int64_t* bt, int64_t g, const AttnRow* rows, int64_t nrows,
                        int64_t k0, int64_t k1, float* part, const NextKeys* next = nullptr, int64_t warm = 0) {
  constexpr bool C8 = KV == kKvS8;
  const int64_t hd = a.head_dim;
  const float scale2 = a.scale * kLog2e;
  alignas(64) float acc[kDecodeRows][kMaxHeadDim];
  alignas(64) float p[kDecodeRows][kDecodeChunk];
  alignas(64) float lv[kDecodeRows][FD_W];
  alignas(64) float kbuf[KV != kKvF32 ? kKeyChunk * kMaxHeadDim : 1];
  alignas(64) float ksb[C8 ? kDecodeChunk : 1], vsb[C8 ? kDecodeChunk : 1];
  float mx[kDecodeRows], corr[kDecodeRows];
  const float* qr[kDecodeRows];
  constexpr bool kQx = FD_W == 16 && KV != kKvS8;  // dots16_rows reads q in q_pairs16's order
  alignas(64) float qxb[kQx ? kDecodeRows : 1][kQx ? kMaxHeadDim : 1];
  const float* qx[kDecodeRows];  // score_rows' q for dots16_rows
  int64_t nk = 0;  // the keys read
  for (int64_t r = 0; r < nrows; ++r) {
    qr[r] = a.q + (rows[r].token * a.num_heads + rows[r].head) * hd;
    for (int64_t d = 0; d < hd; ++d) acc[r][d] = 0.0f;
    for (int64_t j = 0; j < FD_W; ++j) lv[r][j] = 0.0f;
    mx[r] = -INFINITY;
    nk = std::max(nk, std::min(rows[r].nk, k1));
  }
  const bool whole16 = FD_W == 16 && a.block_size % kKeyChunk == 0 && hd % 16 == 0;
  for (int64_t r = 0; r < nrows; ++r) {
    qx[r] = qr[r];
#if FD_W == 16
    if (kQx && whole16) {
      q_pairs16(qr[r], hd, qxb[r]);
      qx[r] = qxb[r];
    }
#endif
  }
  // dots16_rows / c8_scores16 / dots8_rows issue the sub-chunk prefetches: 16-key sub-chunks, each as long
  // as the next.
  const bool spread = whole16 || (FD_W == 8 && a.block_size % kKeyChunk == 0 && hd % 8 == 0 && KV != kKvS8);
  constexpr int64_t esize = kv_esize<KV>;
  const void* vp[kDecodeChunk];
  const char* pfv[kDecodeChunk];  // pv_rows' far value targets (dots8_rows leaves them to it)
  int64_t off[kDecodeChunk + 1];
  // The loop's own prefetches run a chunk ahead of its reads: without this the first chunk would wait on
  // memory.
  prefetch_keys<KV, false>(a, bt, g, std::min(nk, k0 + warm), std::min(nk, k0 + kDecodeChunk));
  // The L2 prefetch's target a chunk ahead of key kk + n: in this item, or in next (same byte layout: a
  // whole block or the context's end; the part boundaries are multiples of the block size).
  // next's keys follow this item's last sub-chunk rounded up to kKeyChunk keys, so each target there starts
  // a sub-chunk of next as the one being scored starts its own.
  const int64_t end = k0 + (nk - k0 + kKeyChunk - 1) / kKeyChunk * kKeyChunk;
  auto far_key = [&](int64_t f, const int64_t*& fbt, int64_t& fg, int64_t& fnk) {
    fbt = bt, fg = g, fnk = nk;
    if (f >= end && next) f += next->k0 - end, fbt = next->bt, fg = next->g, fnk = next->nk;
    return f;
  };
  for (int64_t kk = k0; kk < nk;) {
    // The chunk: up to kDecodeChunk keys in sub-chunks of <= kKeyChunk keys inside one block each.
    int64_t nsub = 0, n = 0;
    off[0] = 0;
    for (; n < kDecodeChunk && kk + n < nk; ++nsub) {
      const int64_t len = std::min(chunk_len(a, kk + n, nk), kDecodeChunk - n), base = key_base(a, bt, g, kk + n);
      // Prefetch the next sub-chunk's keys and values into L1 and those a chunk ahead into L2. A block is
      // 1-4 KiB per head and the next one sits anywhere in the pool (the block table decides), so the
      // hardware prefetcher cannot run ahead across blocks: without this, decode over caches that do not
      // fit in L2 (a step's 30 layers) waits on memory at every block. Both together measured faster than
      // either alone and than longer L1 distances (docs/kernels-measurements.md).
      const int64_t nxt = kk + n + len;
      const int64_t* fbt;
      int64_t fg, fnk;
      const int64_t far = far_key(kk + n + kDecodeChunk, fbt, fg, fnk);
      const char* kc = (const char*)a.k_cache + base * esize;
      SubPrefetch pf{kc, (const char*)a.v_cache + base * esize, kc, (const char*)a.v_cache + base * esize};
      if (spread) {  // the scores issue them (dots16_rows, c8_scores16, dots8_rows)
        if (nxt < nk) {
          const int64_t nb = key_base(a, bt, g, nxt) * esize;
          pf.k0 = (const char*)a.k_cache + nb;
          pf.v0 = (const char*)a.v_cache + nb;
        }
        if (far < fnk) {
          const int64_t nb = key_base(a, fbt, fg, far) * esize;
          pf.k1 = (const char*)a.k_cache + nb;
          pf.v1 = (const char*)a.v_cache + nb;
        }
      } else {
        if (nxt < nk) prefetch_keys<KV, true>(a, bt, g, nxt, nxt + chunk_len(a, nxt, nk));
        if (far < fnk) prefetch_keys<KV, false>(a, fbt, fg, far, far + chunk_len(a, far, fnk));
      }
      score_rows<KV>(qr, qx, nrows, kc, len, hd, whole16, kbuf, p[0] + n, spread ? &pf : nullptr);
      vp[nsub] = (const char*)a.v_cache + base * esize;
      pfv[nsub] = pf.v1;
      if constexpr (C8) {
        for (int64_t j = 0; j < len; ++j) {
          ksb[n + j] = a.k_scales[base / hd + j];
          vsb[n + j] = a.v_scales[base / hd + j];
        }
      }
      n += len;
      off[nsub + 1] = n;
    }
    for (int64_t r = 0; r < nrows; ++r) {
      const int64_t nr = std::min(n, std::min(rows[r].nk, k1) - kk);  // the row's causal limit
      int64_t j = 0;
      if (nr > 0) {
        softmax_update<C8>(p[r], nr, scale2, ksb, vsb, mx[r], lv[r], corr[r]);
        j = (nr + FD_W - 1) / FD_W * FD_W;
      } else {  // past this row's last key: leave its state as it is
        corr[r] = 1.0f;
      }
      for (; j < n; ++j) p[r][j] = 0.0f;
    }
    // dots8_rows' spread sub-chunks leave their far values to the first pv_rows call.
    const bool pv_far = FD_W == 8 && spread;
    for (int64_t r = 0; r < nrows; r += 4) {
      float *ar = acc[r], *pr = p[r], *cr = corr + r;
      const char* const* fv = pv_far && r == 0 ? pfv : nullptr;
      switch (std::min<int64_t>(4, nrows - r)) {
        case 4: pv_rows<4, KV>(ar, pr, cr, vp, off, nsub, hd, fv); break;
        case 3: pv_rows<3, KV>(ar, pr, cr, vp, off, nsub, hd, fv); break;
        case 2: pv_rows<2, KV>(ar, pr, cr, vp, off, nsub, hd, fv); break;
        default: pv_rows<1, KV>(ar, pr, cr, vp, off, nsub, hd, fv);
      }
    }
    kk += n;
  }
  for (int64_t r = 0; r < nrows; ++r)
    finish_row<KV>(a, rows[r], acc[r], lv[r], mx[r], part ? part + r * (hd + 2) : nullptr);
  return next && end - k0 >= kDecodeChunk ? kDecodeChunk : 0;  // the targets reached next's first chunk
}

// Decode rows whose context is longer than kKeysPerPart take it in parts of kKeysPerPart keys, each its
// own work item (split-K), so a batch of one sequence gives the threads more than its few KV heads to
// share: at batch 1 SmolLM2's 3 KV heads left one of 2 threads with twice the other's keys. The parts
// depend on the context alone, never on the batch or the thread count, and combine in a fixed order, so a
// row's result does not change with what shares its step. Batches with enough items gain nothing and pay
// the combine; the part size weighs the two (docs/kernels-measurements.md).
constexpr int64_t kKeysPerPart = 256;

// Rows' outputs from their parts' states (attend_rows with a part buffer), parts in order; w: nparts
// floats of scratch.
static void combine_parts(const AttnArgs& a, const AttnRow* rows, int64_t nrows, int64_t nparts, const float* parts,
                          float* w) {
  const int64_t hd = a.head_dim, stride = nrows * (hd + 2);
  for (int64_t r = 0; r < nrows; ++r) {
    float m = -INFINITY;
    for (int64_t p = 0; p < nparts; ++p) m = std::max(m, parts[p * stride + r * (hd + 2) + hd]);
    float l = 0.0f;
    for (int64_t p = 0; p < nparts; ++p) {
      const float* st = parts + p * stride + r * (hd + 2);
      w[p] = st[hd + 1] > 0.0f ? std::exp2(st[hd] - m) : 0.0f;  // base-2 maxima
      l += st[hd + 1] * w[p];
    }
    float* op = a.out + (rows[r].token * a.num_heads + rows[r].head) * hd;
    for (int64_t d = 0; d < hd; ++d) op[d] = 0.0f;
    for (int64_t p = 0; p < nparts; ++p) {  // parts in order for each d, as one sum per d would add them
      const float* acc = parts + p * stride + r * (hd + 2);
      for (int64_t d = 0; d < hd; ++d) op[d] += acc[d] * w[p];
    }
    for (int64_t d = 0; d < hd; ++d) op[d] /= l;
  }
}

// Online-softmax state of up to FD_W rows held in vector lanes; qt / ot are q (pre-scaled) and the
// output transposed: [hd][FD_W].
struct LaneState {
  float* qt;
  float* ot;
  vf limit;  // last key position each lane may see
  int64_t min_nk;
  vf mx, l;
};

// Scores of n <= kKeyChunk keys (rows kp, stride hd) for the lanes of S sets of rows (qt[s]: set s's q),
// in passes of KB keys, D dims a step: each pass keeps its S * KB accumulators and S * D q vectors in
// registers (AVX-512: KB = 16, D = 4, 20 of 32; AVX2: KB * S = 8, S * (KB + D) + 1 <= 16), so each FMA
// loads at most its broadcast key element, and a broadcast feeds all S sets. A last pass past key n - 1
// scores that key again in the missing places (never read past the chunk). Each key's sum runs over d in
// order whatever KB, D and S are. hd must be a multiple of 4.
template <int S>
static inline void lane_scores_fixed(const float* const* qt, const float* kp, int64_t hd, int64_t n,
                                     vf (*s)[kKeyChunk]) {
  constexpr int KB = FD_W == 8 ? 8 / S : kKeyChunk, D = FD_W == 8 && S > 1 ? 2 : 4;
  for (int64_t j0 = 0; j0 < n; j0 += KB) {
    const float* kr[KB];
    for (int j = 0; j < KB; ++j) kr[j] = kp + std::min<int64_t>(j0 + j, n - 1) * hd;
    vf acc[S][KB];
    for (int i = 0; i < S; ++i)
      for (int j = 0; j < KB; ++j) acc[i][j] = vzero();
    for (int64_t d = 0; d < hd; d += D) {
      vf q[S][D];
      for (int i = 0; i < S; ++i)
        for (int e = 0; e < D; ++e) q[i][e] = vload(qt[i] + (d + e) * FD_W);
      for (int j = 0; j < KB; ++j)
        for (int e = 0; e < D; ++e) {
          const vf k = vset1(kr[j][d + e]);
          for (int i = 0; i < S; ++i) acc[i][j] = vfma(q[i][e], k, acc[i][j]);
        }
    }
    for (int i = 0; i < S; ++i)
      for (int j = 0; j < KB && j0 + j < n; ++j) s[i][j0 + j] = acc[i][j];
  }
}

// A partial chunk takes the passes on AVX2, whose passes are short; on AVX-512 one 16-key pass would
// mostly score the last key again.
template <int S>
static inline void lane_scores(const float* const* qt, const float* kp, int64_t hd, int64_t n, vf (*s)[kKeyChunk]) {
  if ((n == kKeyChunk || FD_W == 8) && hd % 4 == 0) return lane_scores_fixed<S>(qt, kp, hd, n, s);
  for (int i = 0; i < S; ++i)
    for (int64_t j = 0; j < n; ++j) {
      vf acc = vzero();
      for (int64_t d = 0; d < hd; ++d) acc = vfma(vload(qt[i] + d * FD_W), vset1(kp[j * hd + d]), acc);
      s[i][j] = acc;
    }
}

// ot[s] = ot[s] * corr[s] + sum_j p[s][j] * v_j for S sets of lanes, DB output dims at a time so S * DB FMA
// chains run side by side (AVX2: eight, enough to cover the FMA latency at two a cycle) and each broadcast
// value feeds all S sets; each dim's sum runs over j in order.
template <int S>
static inline void lane_pv(float* const* ot, const vf (*p)[kKeyChunk], const vf* corr, const float* vp, int64_t hd,
                           int64_t n) {
  constexpr int64_t DB = FD_W == 8 ? 8 / S : 4;
  int64_t d = 0;
  for (; d + DB <= hd; d += DB) {
    vf o[S][DB];
    for (int i = 0; i < S; ++i)
      for (int64_t b = 0; b < DB; ++b) o[i][b] = vmul(vload(ot[i] + (d + b) * FD_W), corr[i]);
    for (int64_t j = 0; j < n; ++j) {
      const float* vj = vp + j * hd + d;
      for (int64_t b = 0; b < DB; ++b) {
        const vf v = vset1(vj[b]);
        for (int i = 0; i < S; ++i) o[i][b] = vfma(p[i][j], v, o[i][b]);
      }
    }
    for (int i = 0; i < S; ++i)
      for (int64_t b = 0; b < DB; ++b) vstore(ot[i] + (d + b) * FD_W, o[i][b]);
  }
  for (; d < hd; ++d)
    for (int i = 0; i < S; ++i) {
      vf o = vmul(vload(ot[i] + d * FD_W), corr[i]);
      for (int64_t j = 0; j < n; ++j) o = vfma(p[i][j], vset1(vp[j * hd + d]), o);
      vstore(ot[i] + d * FD_W, o);
    }
}

// One chunk of n keys starting at key kk for S sets of lanes: scores, causal mask near the diagonal, online
// softmax update.
template <int S>
static inline void lane_chunk(LaneState* st, const float* kp, const float* vp, int64_t hd, int64_t kk, int64_t n) {
  vf p[S][kKeyChunk], corr[S];
  const float* qt[S];
  float* ot[S];
  for (int i = 0; i < S; ++i) qt[i] = st[i].qt, ot[i] = st[i].ot;
  lane_scores<S>(qt, kp, hd, n, p);
  for (int i = 0; i < S; ++i) {
    vf cmax = st[i].mx;
    for (int64_t j = 0; j < n; ++j) {
      if (kk + j >= st[i].min_nk) p[i][j] = vmask_le(p[i][j], (float)(kk + j), st[i].limit);
      cmax = vmax(cmax, p[i][j]);
    }
    corr[i] = vexp(vsub(st[i].mx, cmax));  // ~0 on the first chunk, where mx = -inf
    vf psum = vzero();
    for (int64_t j = 0; j < n; ++j) {
      p[i][j] = vexp(vsub(p[i][j], cmax));
      // A key past a lane's limit weighs exactly 0 (vexp(-inf) is ~1e-38): a lane's result must not
      // depend on the longer contexts of the other rows in its tile.
      if (kk + j >= st[i].min_nk)
        p[i][j] = vmul(p[i][j], vmax(vmask_le(vset1(1.0f), (float)(kk + j), st[i].limit), vzero()));
      psum = vadd(psum, p[i][j]);
    }
    st[i].l = vfma(st[i].l, corr[i], psum);
    st[i].mx = cmax;
  }
  lane_pv<S>(ot, p, corr, vp, hd, n);
}

// Lane sets per prompt tile: AVX2 widens each bf16 / C8 chunk once for two vectors of rows, which halves
// that conversion per row; each lane's result is its own whatever shares the tile.
constexpr int64_t kLaneSets = FD_W == 8 ? 2 : 1;

// Keys and values of one (sequence, KV head) as fp32 for the lane tiles a thread takes of it: keys
// 0 .. n - 1 at k / v + key * head_dim, widened (bf16) or dequantized (C8) by chunk_kv, so they hold the
// very values a tile's own chunk buffer would. A prompt run's tiles of a pair all read its keys from 0 up,
// so the pair's keys are converted once per thread instead of once per tile. Valid for one call.
struct WideKv {
  int64_t b = -1, g = -1, n = 0;
  float *k = nullptr, *v = nullptr;
};

// This thread's widen_kv buffers, >= floats floats in all, kept across calls and grown only: a fresh
// allocation per call would map and fault in new pages every layer of a prefill.
static float* wide_scratch(int64_t floats) {
  static thread_local Scratch buf;
  static thread_local int64_t cap = 0;
  if (cap < floats) {
    buf = scratch(floats);
    cap = floats;
  }
  return buf.get();
}

// w covers keys [0, nk) of (sequence b, KV head g, block table bt): converts the ones it lacks (all of them
// when it held another pair). w's buffers hold >= nk * head_dim floats each.
template <int KV>
static void widen_kv(const AttnArgs& a, const int64_t* bt, int64_t b, int64_t g, int64_t nk, WideKv& w) {
  if (w.b != b || w.g != g) w.b = b, w.g = g, w.n = 0;
  for (int64_t kk = w.n; kk < nk;) {
    const int64_t n = chunk_len(a, kk, nk);
    const float *kp, *vp;
    chunk_kv<KV>(a, key_base(a, bt, g, kk), n, w.k + kk * a.head_dim, w.v + kk * a.head_dim, kp, vp);
    kk += n;
  }
  w.n = std::max(w.n, nk);
}

// Up to kLaneSets * FD_W rows in the lanes of one vector per FD_W rows; idle lanes repeat the last row.
// Each chunk's keys and values are widened once for all sets (or read from wide, the tile's pair already
// converted: widen_kv); the chunks follow the tile's longest context (a shorter row's keys past its own
// context weigh exactly 0).
template <int KV>
static void attend_lanes(const AttnArgs& a, const int64_t* bt, int64_t g, const AttnRow* rows, int64_t nrows,
                         const WideKv* wide = nullptr) {
  constexpr int64_t kBuf = KV != kKvF32 ? kKeyChunk * kMaxHeadDim : 1;
  const int64_t hd = a.head_dim, nsets = (nrows + FD_W - 1) / FD_W;
  alignas(64) float qt[kLaneSets][kMaxHeadDim * FD_W], ot[kLaneSets][kMaxHeadDim * FD_W], lim[FD_W];
  alignas(64) float kbuf[kBuf], vbuf[kBuf];
  LaneState st[kLaneSets];
  int64_t nk = 0;
  for (int64_t s = 0; s < nsets; ++s) {
    int64_t min_nk = INT64_MAX;
    for (int64_t r = 0; r < FD_W; ++r) {
      const AttnRow& row = rows[std::min(s * FD_W + r, nrows - 1)];
      const float* qp = a.q + (row.token * a.num_heads + row.head) * hd;
      for (int64_t d = 0; d < hd; ++d) qt[s][d * FD_W + r] = qp[d] * a.scale;
      lim[r] = (float)(row.nk - 1);
      nk = std::max(nk, row.nk);
      min_nk = std::min(min_nk, row.nk);
    }
    for (int64_t d = 0; d < hd * FD_W; ++d) ot[s][d] = 0.0f;
    st[s] = LaneState{qt[s], ot[s], vload(lim), min_nk, vset1(-INFINITY), vzero()};
  }
  for (int64_t kk = 0; kk < nk;) {
    const int64_t n = chunk_len(a, kk, nk);
    const float *kp, *vp;
    if (wide) {
      kp = wide->k + kk * hd;
      vp = wide->v + kk * hd;
    } else {
      chunk_kv<KV>(a, key_base(a, bt, g, kk), n, kbuf, vbuf, kp, vp);
    }
    if (kLaneSets > 1 && nsets == kLaneSets) {
      lane_chunk<kLaneSets>(st, kp, vp, hd, kk, n);
    } else {
      for (int64_t s = 0; s < nsets; ++s) lane_chunk<1>(st + s, kp, vp, hd, kk, n);
    }
    kk += n;
  }
  for (int64_t s = 0; s < nsets; ++s) {
    vstore(lim, st[s].l);
    for (int64_t r = 0; r < std::min<int64_t>(FD_W, nrows - s * FD_W); ++r) {
      const AttnRow& row = rows[s * FD_W + r];
      float* op = a.out + (row.token * a.num_heads + row.head) * hd;
      for (int64_t d = 0; d < hd; ++d) op[d] = ot[s][d * FD_W + r] / lim[r];
    }
  }
}

#if FD_W == 16
#include "attn_amx.h"
#endif

// Marked prompt rows (a.prompt_rows) over a bf16 cache with head_dim a multiple of 64 take the AMX tiles
// (attn_amx.h) on the AMX level: a cache that already holds bf16 keys and values is the user's choice of
// bf16 attention. fp32 and C8 caches, unmarked rows and other CPUs take the lane path, so an fp32 model
// with an fp32 cache keeps fp32 attention everywhere.
template <int KV>
static bool use_amx_attention(const AttnArgs& a) {
#if FD_W == 16
  // The AMX level implies AVX512-BF16 (kernels.cc's detect_isa), which attn_amx.h's vcvtne2ps2bf16 needs.
  return KV == kKvBF16 && a.head_dim % 64 == 0 && active_isa() == kIsaAmx;
#else
  (void)a;
  return false;
#endif
}

template <int KV>
static void paged_attention_impl(const AttnArgs& a) {
  struct Item {
    int64_t b, g, r0, r1;  // rows r0..r1 of (sequence b, KV head g); row r = query r / group, head r % group
    int64_t k0, k1;        // the keys it takes (decode parts), else 0 and INT64_MAX
    int64_t part;          // offset of its state in `parts`, or -1: write the outputs
    bool lanes;            // rows in vector lanes (attend_lanes), else attend_rows
    bool prompt;           // rows of a marked prompt run (a.prompt_rows): the AMX level's bf16 path
    bool wide;             // a lane tile of a run with several tiles per KV head: reads widen_kv's keys
  };
  struct Split {
    int64_t item, nparts;  // first of its parts' items (consecutive), how many
  };
  const int64_t group = a.num_heads / a.num_kv_heads, hd = a.head_dim;
#if FD_W == 16
  const bool amx = use_amx_attention<KV>(a);
#else
  const bool amx = false;
#endif
  // A marked prompt run's tiles: 32 rows on the AMX path (two lane groups read each K and V^T tile once),
  // else kLaneSets vectors' lanes. The size depends on the level alone, never on the batch.
  const int64_t prompt_tile = amx ? 2 * FD_W : kLaneSets * FD_W;
  std::vector<Item> items;
  std::vector<Split> splits;
  int64_t part_floats = 0;
  // The most keys a `wide` item reads (widen_kv's buffers: that many times hd floats each).
  int64_t wide_nk = 0;
  // Rows r0 .. r1 of sequence b (a run of its queries' rows) in tiles sized by the run: lanes for runs of
  // >= kMinLaneRows rows (every tile of a marked prompt run: `lanes`, so a prompt row's path does not
  // depend on where a chunk or tile boundary fell), else the decode path, whose contexts over
  // kKeysPerPart keys split into parts by the tile's own last key (the rows' context alone).
  auto add_run = [&](int64_t b, int64_t r0, int64_t r1, bool lanes) {
    const int64_t nrows = r1 - r0, nq = a.query_start_loc[b + 1] - a.query_start_loc[b];
    const int64_t tile = lanes ? prompt_tile : nrows >= kMinLaneRows ? FD_W : kDecodeRows;
    // Tiles of one KV head share its keys from 0 up: converted once per thread when there are several
    // (a bf16 or C8 cache) and the run's keys fit kMaxWideFloats.
    const int64_t run_nk = a.seq_lens[b] - nq + (r1 - 1) / group + 1;
    const bool wide = KV != kKvF32 && FD_W > 1 && !amx && (lanes || tile == FD_W) && nrows > tile &&
                      run_nk * hd <= kMaxWideFloats;
    if (wide) wide_nk = std::max(wide_nk, run_nk);
    for (int64_t g = 0; g < a.num_kv_heads; ++g)
      for (int64_t t0 = r0; t0 < r1; t0 += tile) {
        const int64_t t1 = std::min(r1, t0 + tile);
        const int64_t nk = a.seq_lens[b] - nq + (t1 - 1) / group + 1;  // the tile's last query's keys
        const int64_t nparts = (nk + kKeysPerPart - 1) / kKeysPerPart;
        if ((FD_W > 1 && (lanes || t1 - t0 >= kMinLaneRows)) || nparts <= 1) {
          const bool lane = FD_W > 1 && (lanes || t1 - t0 >= kMinLaneRows);
          items.push_back({b, g, t0, t1, 0, INT64_MAX, -1, lane, lanes, wide && lane});
        } else {
          splits.push_back({(int64_t)items.size(), nparts});
          for (int64_t p = 0; p < nparts; ++p) {
            items.push_back(
                {b, g, t0, t1, p * kKeysPerPart, (p + 1) * kKeysPerPart, part_floats, false, false, false});
            part_floats += (t1 - t0) * (hd + 2);
          }
        }
      }
  };
  // Prompt-token queries are tiled together; each generated-token query (marked 0 in a.prompt_rows,
  // after the sequence's prompt queries) is a run of its own, exactly the items its decode step had, so a
  // generated token recomputed after preemption gets the output bits it got when it was decoded.
  for (int64_t b = 0; b < a.num_seqs; ++b) {
    const int64_t qs = a.query_start_loc[b], nq = a.query_start_loc[b + 1] - qs;
    int64_t nprompt = nq;
    if (a.prompt_rows) {
      nprompt = 0;
      while (nprompt < nq && a.prompt_rows[qs + nprompt]) ++nprompt;
    }
    if (nprompt > 0) add_run(b, 0, nprompt * group, a.prompt_rows != nullptr);
    for (int64_t i = nprompt; i < nq; ++i) add_run(b, i * group, (i + 1) * group, false);
  }
  // Uninitialized: every part's item writes its whole state before the combine reads it.
  std::unique_ptr<float[]> parts(new float[part_floats > 0 ? part_floats : 1]);
  int64_t max_parts = 0;
  for (const Split& sp : splits) max_parts = std::max(max_parts, sp.nparts);
  auto item_rows = [&](const Item& w, AttnRow* rows) {
    const int64_t qs = a.query_start_loc[w.b], nq = a.query_start_loc[w.b + 1] - qs;
    for (int64_t r = w.r0; r < w.r1; ++r) {
      const int64_t i = r / group;
      rows[r - w.r0] = {qs + i, w.g * group + r % group, a.seq_lens[w.b] - nq + i + 1};
    }
  };
  const int64_t nitems = (int64_t)items.size();
  // The items in the order the threads claim them, from the back: a split's parts in key order, so that a
  // thread whose run holds a part and the next prefetches past the first (attend_rows' ahead).
  std::vector<int64_t> order(nitems);
  for (int64_t i = 0; i < nitems; ++i) order[i] = i;
  for (const Split& sp : splits) std::reverse(order.begin() + sp.item, order.begin() + sp.item + sp.nparts);
#if FD_W == 16
  // AMX: K and V^T in bf16 for every (sequence, KV head) that has lane items, up to the keys its last
  // prompt row sees; made in parallel over 64-key chunks before any item reads them.
  std::vector<int64_t> amx_nk(amx ? a.num_seqs : 0, 0), amx_off(amx ? a.num_seqs : 0, 0);
  std::unique_ptr<uint16_t[]> amx_buf;
  bool amx_tiles = false;  // some item takes attend_amx: its threads configure the tiles
  if (amx) {
    int64_t total = 0;
    std::vector<std::array<int64_t, 3>> chunks;  // (sequence, KV head, first key)
    for (const Item& w : items) {
      if (!w.prompt) continue;
      amx_tiles = true;
      const int64_t nq = a.query_start_loc[w.b + 1] - a.query_start_loc[w.b];
      amx_nk[w.b] = std::max(amx_nk[w.b], a.seq_lens[w.b] - nq + (w.r1 - 1) / group + 1);
    }
    for (int64_t b = 0; b < a.num_seqs; ++b) {
      const int64_t pad = (amx_nk[b] + kAmxKeys - 1) / kAmxKeys * kAmxKeys;
      amx_off[b] = total;
      total += 2 * pad * hd * a.num_kv_heads;
      for (int64_t g = 0; g < a.num_kv_heads; ++g)
        for (int64_t k0 = 0; k0 < pad; k0 += kAmxKeys) chunks.push_back({b, g, k0});
    }
    amx_buf.reset(new uint16_t[total > 0 ? total : 1]);
    const int64_t nchunks = (int64_t)chunks.size();
#pragma omp parallel for schedule(static) if (nchunks > 1)
    for (int64_t i = 0; i < nchunks; ++i) {
      const int64_t b = chunks[i][0], g = chunks[i][1];
      const int64_t pad = (amx_nk[b] + kAmxKeys - 1) / kAmxKeys * kAmxKeys;
      uint16_t* kb = amx_buf.get() + amx_off[b] + 2 * g * pad * hd;
      amx_kv_prepare<KV>(a, a.block_tables + b * a.max_blocks, g, amx_nk[b], chunks[i][2], kb, kb + pad * hd);
    }
  }
#endif
  // Dynamic scheduling evens out the causal triangle, where late queries see more keys. It is done by
  // hand with an atomic counter: GCC's schedule(dynamic) calls GOMP_loop_nonmonotonic_*, which Paddle's
  // libiomp5 lacks, so the symbol would bind to libgomp and each thread would run every item. A thread
  // takes a run of items at a time (ranges.h ItemRuns): taking them one by one cost a measurable part of a
  // prompt's attention. The counter has its own cache line.
  struct alignas(64) Counter {
    std::atomic<int64_t> v{0};
  } next;
#pragma omp parallel if (nitems > 1)
  {
#if FD_W == 16
    if (amx_tiles) load_amx_tile_config();
#endif
    const int64_t nth = omp_get_num_threads();
    // Runs of left / (4 x threads) items; the item after each on this thread is attend_rows' next.
    ItemRuns runs(next.v, nitems, 4 * nth);
    int64_t warm = 0;
    WideKv wkv;  // this thread's converted keys and values (widen_kv), placed by its first wide item
    for (int64_t it; (it = runs.next()) < nitems;) {
      const int64_t nit = runs.following();
      // In reverse: a prompt run's tiles were added in ascending key counts, so its longest come first and
      // the threads finish together on short ones. The order changes no item's result.
      const Item& w = items[order[nitems - 1 - it]];
      const int64_t* bt = a.block_tables + w.b * a.max_blocks;
      AttnRow rows[std::max(kDecodeRows, std::max<int64_t>(2, kLaneSets) * FD_W)];  // a decode, AMX or lane tile
      item_rows(w, rows);
      const int64_t n = w.r1 - w.r0;
#if FD_W == 16
      if (w.prompt && amx) {
        const int64_t pad = (amx_nk[w.b] + kAmxKeys - 1) / kAmxKeys * kAmxKeys;
        const uint16_t* kb = amx_buf.get() + amx_off[w.b] + 2 * w.g * pad * hd;
        attend_amx(a, AmxKv{kb, kb + pad * hd}, rows, n);
        warm = 0;
        continue;
      }
#endif
      if (FD_W > 1 && w.lanes) {
        if (w.wide) {
          if (!wkv.k) {
            wkv.k = wide_scratch(2 * wide_nk * hd);
            wkv.v = wkv.k + wide_nk * hd;
          }
          widen_kv<KV>(a, bt, w.b, w.g, rows[n - 1].nk, wkv);
        }
        attend_lanes<KV>(a, bt, w.g, rows, n, w.wide ? &wkv : nullptr);
        warm = 0;
      } else {
        // The next decode item on this thread, if one is known: its keys and its rows' causal limit.
        NextKeys nxk{};
        const NextKeys* np = nullptr;
        if (nit < nitems) {
          const Item& x = items[order[nitems - 1 - nit]];
          if (!x.lanes) {
            const int64_t xq = a.query_start_loc[x.b + 1] - a.query_start_loc[x.b];
            const int64_t xnk = a.seq_lens[x.b] - xq + (x.r1 - 1) / group + 1;
            nxk = {a.block_tables + x.b * a.max_blocks, x.g, x.k0, std::min(xnk, x.k1)};
            np = &nxk;
          }
        }
        warm = attend_rows<KV>(a, bt, w.g, rows, n, w.k0, w.k1, w.part >= 0 ? parts.get() + w.part : nullptr, np,
                               warm);
      }
    }
#if FD_W == 16
    if (amx_tiles) amx_tile_done();
#endif
  }
  const int64_t nsplits = (int64_t)splits.size();
#pragma omp parallel if (nsplits > 1)
  {
    std::vector<float> weights(max_parts);
#pragma omp for schedule(static) nowait
    for (int64_t i = 0; i < nsplits; ++i) {
      const Item& w = items[splits[i].item];
      AttnRow rows[kDecodeRows];
      item_rows(w, rows);
      combine_parts(a, rows, w.r1 - w.r0, splits[i].nparts, parts.get() + w.part, weights.data());
    }
  }
}

static void paged_attention(const AttnArgs& a) {
  switch (a.kv_kind) {
    case kKvS8: return paged_attention_impl<kKvS8>(a);
    case kKvBF16: return paged_attention_impl<kKvBF16>(a);
    default: return paged_attention_impl<kKvF32>(a);
  }
}
