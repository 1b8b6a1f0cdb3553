// Paged attention over the block-table KV cache, included by kern_impl.h inside an ISA namespace.
// Varlen batch: sequence b owns query tokens query_start_loc[b] .. query_start_loc[b+1]; query i sits at
// position seq_len - q_len + i and attends causally to keys 0..position through its block table.
//
// Work is split into (sequence, KV head, tile of rows), where a row is one (query, head) pair of the KV
// head's GQA group, so a tile's rows share every key and value they read. Tiles of >= kMinLaneRows rows
// (prefill) put rows in vector lanes: scores and the P x V update are plain FMAs with broadcast key/value
// elements, no horizontal sums. Smaller tiles (decode) use dot products, row by row within each chunk of
// keys, so the group's heads read a chunk from L1 after the first one loads it.
//
// The cache holds fp32, or int8 codes with per-row scales (the C8 cache, c8_impl.h): the kernels are
// templates on C8, and a C8 instance dequantizes each chunk of keys and values once into a small fp32
// buffer that every row of the work item then reads, so the fp32 instance is exactly the plain kernel.
// No include guard on purpose.

#include "c8_impl.h"

constexpr int64_t kKeyChunk = 16;     // keys per online-softmax update
constexpr int64_t kMaxHeadDim = 512;  // checked by the glue
constexpr int64_t kMinLaneRows = FD_W >= 8 ? FD_W / 2 : 4;  // below it lanes would idle
constexpr int64_t kDecodeRows = 16;  // rows per work item on the one-row-at-a-time path

struct AttnRow {
  int64_t token, head, nk;  // query token index in T, query head, keys it sees (position + 1)
};

// Pointer to the first of `n` consecutive keys starting at key kk (never crossing a block).
static inline int64_t key_base(const AttnArgs& a, const int64_t* bt, int64_t g, int64_t kk) {
  return ((bt[kk / a.block_size] * a.num_kv_heads + g) * a.block_size + kk % a.block_size) * a.head_dim;
}

// Keys and values of the chunk of n rows at `base` as fp32: the cache itself, or (C8) dequantized into
// kbuf / vbuf. The scales share the cache's indexing without head_dim: row base / hd.
template <bool C8>
static inline void chunk_kv(const AttnArgs& a, int64_t base, int64_t n, float* kbuf, float* vbuf,
                            const float*& kp, const float*& vp) {
  if constexpr (C8) {
    dequant_rows((const int8_t*)a.k_cache + base, a.k_scales + base / a.head_dim, n, a.head_dim, kbuf);
    dequant_rows((const int8_t*)a.v_cache + base, a.v_scales + base / a.head_dim, n, a.head_dim, vbuf);
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

// Online-softmax update of one row with n scores sc[0..n) (already scaled) against values vp.
static inline void row_update(float* sc, int64_t n, const float* vp, int64_t hd, float* acc, float& mx,
                              float& l) {
  float cmax = mx;
  for (int64_t j = 0; j < n; ++j) cmax = std::max(cmax, sc[j]);
  const float corr = std::exp(mx - cmax);  // exp(-inf) = 0 on the first chunk
  int64_t j = 0;
  for (; j + FD_W <= n; j += FD_W) vstore(sc + j, vexp(vsub(vload(sc + j), vset1(cmax))));
  for (; j < n; ++j) sc[j] = std::exp(sc[j] - cmax);
  float psum = 0.0f;
  for (j = 0; j < n; ++j) psum += sc[j];
  l = l * corr + psum;
  mx = cmax;
  int64_t d = 0;
  for (; d + FD_W <= hd; d += FD_W) {
    vf o = vmul(vload(acc + d), vset1(corr));
    for (j = 0; j < n; ++j) o = vfma(vset1(sc[j]), vload(vp + j * hd + d), o);
    vstore(acc + d, o);
  }
  for (; d < hd; ++d) {
    float o = acc[d] * corr;
    for (j = 0; j < n; ++j) o += sc[j] * vp[j * hd + d];
    acc[d] = o;
  }
}

#if FD_W == 16
// sc[j] = scale * dot(q, k_j) for 16 keys (hd % 16 == 0): 16 vector accumulators, then a shuffle tree
// folds them into one vector of 16 sums (~3 shuffles/adds per key instead of a full horizontal sum each).
static inline void dots16(const float* q, const float* kp, int64_t hd, float scale, float* sc) {
  __m512 acc[16];
  for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
  for (int64_t d = 0; d < hd; d += 16) {
    const __m512 qv = _mm512_loadu_ps(q + d);
    for (int j = 0; j < 16; ++j) acc[j] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(kp + j * hd + d), acc[j]);
  }
  __m512 r[8], s4[4], u[2];
  for (int i = 0; i < 8; ++i)  // 256-bit halves: lanes 0-7 key i, 8-15 key i+8
    r[i] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[i], acc[i + 8], 0x44),
                         _mm512_shuffle_f32x4(acc[i], acc[i + 8], 0xEE));
  for (int i = 0; i < 4; ++i)  // 128-bit quarters: keys i, i+8, i+4, i+12
    s4[i] = _mm512_add_ps(_mm512_shuffle_f32x4(r[i], r[i + 4], 0x88), _mm512_shuffle_f32x4(r[i], r[i + 4], 0xDD));
  for (int i = 0; i < 2; ++i)  // pairs inside each quarter
    u[i] = _mm512_add_ps(_mm512_unpacklo_ps(s4[i], s4[i + 2]), _mm512_unpackhi_ps(s4[i], s4[i + 2]));
  const __m512 v = _mm512_add_ps(
      _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(u[0]), _mm512_castps_pd(u[1]))),
      _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(u[0]), _mm512_castps_pd(u[1]))));
  // Lanes now hold keys 0,2,1,3, 8,10,9,11, 4,6,5,7, 12,14,13,15; the permutation is its own inverse.
  const __m512i order = _mm512_setr_epi32(0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15);
  _mm512_storeu_ps(sc, _mm512_mul_ps(_mm512_permutexvar_ps(order, v), _mm512_set1_ps(scale)));
}
#endif

// A few rows (decode: the GQA group's heads) one at a time with dot products, chunk by chunk so a
// chunk's keys and values stay in L1 for every row that reads them.
template <bool C8>
static void attend_rows(const AttnArgs& a, const int64_t* bt, int64_t g, const AttnRow* rows, int64_t nrows) {
  const int64_t hd = a.head_dim;
  float acc[kDecodeRows][kMaxHeadDim], mx[kDecodeRows], l[kDecodeRows], sc[kKeyChunk];
  alignas(64) float kbuf[C8 ? kKeyChunk * kMaxHeadDim : 1], vbuf[C8 ? kKeyChunk * kMaxHeadDim : 1];
  int64_t nk = 0;
  for (int64_t r = 0; r < nrows; ++r) {
    for (int64_t d = 0; d < hd; ++d) acc[r][d] = 0.0f;
    mx[r] = -INFINITY;
    l[r] = 0.0f;
    nk = std::max(nk, rows[r].nk);
  }
  for (int64_t kk = 0; kk < nk;) {
    const int64_t n = chunk_len(a, kk, nk);
    const float *kp, *vp;
    chunk_kv<C8>(a, key_base(a, bt, g, kk), n, kbuf, vbuf, kp, vp);
    for (int64_t r = 0; r < nrows; ++r) {
      const int64_t nr = std::min(n, rows[r].nk - kk);  // the row's causal limit
      if (nr <= 0) continue;
      const float* qp = a.q + (rows[r].token * a.num_heads + rows[r].head) * hd;
#if FD_W == 16
      if (nr == 16 && hd % 16 == 0) {
        dots16(qp, kp, hd, a.scale, sc);
      } else
#endif
        for (int64_t j = 0; j < nr; ++j) sc[j] = dot(qp, kp + j * hd, hd) * a.scale;
      row_update(sc, nr, vp, hd, acc[r], mx[r], l[r]);
    }
    kk += n;
  }
  for (int64_t r = 0; r < nrows; ++r) {
    float* op = a.out + (rows[r].token * a.num_heads + rows[r].head) * hd;
    for (int64_t d = 0; d < hd; ++d) op[d] = acc[r][d] / l[r];
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

// Scores of N keys (rows kp, stride hd) for all lanes. Fixed N keeps the N accumulators and four q
// vectors in registers (N + 5 <= 32 for N = 16 on AVX-512), so each FMA loads only its broadcast key
// element; hd must be a multiple of 4.
template <int N>
static inline void lane_scores_fixed(const float* qt, const float* kp, int64_t hd, vf* s) {
  vf acc[N];
  for (int j = 0; j < N; ++j) acc[j] = vzero();
  for (int64_t d = 0; d < hd; d += 4) {
    const vf q0 = vload(qt + d * FD_W), q1 = vload(qt + (d + 1) * FD_W);
    const vf q2 = vload(qt + (d + 2) * FD_W), q3 = vload(qt + (d + 3) * FD_W);
    for (int j = 0; j < N; ++j) {
      const float* kj = kp + j * hd + d;
      acc[j] = vfma(q0, vset1(kj[0]), acc[j]);
      acc[j] = vfma(q1, vset1(kj[1]), acc[j]);
      acc[j] = vfma(q2, vset1(kj[2]), acc[j]);
      acc[j] = vfma(q3, vset1(kj[3]), acc[j]);
    }
  }
  for (int j = 0; j < N; ++j) s[j] = acc[j];
}

static inline void lane_scores(const float* qt, const float* kp, int64_t hd, int64_t n, vf* s) {
  if (n == kKeyChunk && hd % 4 == 0) return lane_scores_fixed<kKeyChunk>(qt, kp, hd, s);
  for (int64_t j = 0; j < n; ++j) {
    vf acc = vzero();
    for (int64_t d = 0; d < hd; ++d) acc = vfma(vload(qt + d * FD_W), vset1(kp[j * hd + d]), acc);
    s[j] = acc;
  }
}

// ot = ot * corr + sum_j p[j] * v_j, four output dims at a time so four FMA chains run side by side.
static inline void lane_pv(float* ot, const vf* p, vf corr, const float* vp, int64_t hd, int64_t n) {
  int64_t d = 0;
  for (; d + 4 <= hd; d += 4) {
    vf o0 = vmul(vload(ot + d * FD_W), corr), o1 = vmul(vload(ot + (d + 1) * FD_W), corr);
    vf o2 = vmul(vload(ot + (d + 2) * FD_W), corr), o3 = vmul(vload(ot + (d + 3) * FD_W), corr);
    for (int64_t j = 0; j < n; ++j) {
      const float* vj = vp + j * hd + d;
      o0 = vfma(p[j], vset1(vj[0]), o0);
      o1 = vfma(p[j], vset1(vj[1]), o1);
      o2 = vfma(p[j], vset1(vj[2]), o2);
      o3 = vfma(p[j], vset1(vj[3]), o3);
    }
    vstore(ot + d * FD_W, o0);
    vstore(ot + (d + 1) * FD_W, o1);
    vstore(ot + (d + 2) * FD_W, o2);
    vstore(ot + (d + 3) * FD_W, o3);
  }
  for (; d < hd; ++d) {
    vf o = vmul(vload(ot + d * FD_W), corr);
    for (int64_t j = 0; j < n; ++j) o = vfma(p[j], vset1(vp[j * hd + d]), o);
    vstore(ot + d * FD_W, o);
  }
}

// One chunk of n keys starting at key kk: scores, causal mask near the diagonal, online softmax update.
static inline void lane_chunk(LaneState& st, const float* kp, const float* vp, int64_t hd, int64_t kk, int64_t n) {
  vf p[kKeyChunk];
  lane_scores(st.qt, kp, hd, n, p);
  vf cmax = st.mx;
  for (int64_t j = 0; j < n; ++j) {
    if (kk + j >= st.min_nk) p[j] = vmask_le(p[j], (float)(kk + j), st.limit);
    cmax = vmax(cmax, p[j]);
  }
  const vf corr = vexp(vsub(st.mx, cmax));  // ~0 on the first chunk, where mx = -inf
  vf psum = vzero();
  for (int64_t j = 0; j < n; ++j) psum = vadd(psum, p[j] = vexp(vsub(p[j], cmax)));
  st.l = vfma(st.l, corr, psum);
  st.mx = cmax;
  lane_pv(st.ot, p, corr, vp, hd, n);
}

// Up to FD_W rows in the lanes of one vector; idle lanes repeat the last row.
template <bool C8>
static void attend_lanes(const AttnArgs& a, const int64_t* bt, int64_t g, const AttnRow* rows, int64_t nrows) {
  const int64_t hd = a.head_dim;
  alignas(64) float qt[kMaxHeadDim * FD_W], ot[kMaxHeadDim * FD_W], lim[FD_W];
  alignas(64) float kbuf[C8 ? kKeyChunk * kMaxHeadDim : 1], vbuf[C8 ? kKeyChunk * kMaxHeadDim : 1];
  int64_t nk = 0, min_nk = INT64_MAX;
  for (int64_t r = 0; r < FD_W; ++r) {
    const AttnRow& row = rows[std::min(r, nrows - 1)];
    const float* qp = a.q + (row.token * a.num_heads + row.head) * hd;
    for (int64_t d = 0; d < hd; ++d) qt[d * FD_W + r] = qp[d] * a.scale;
    lim[r] = (float)(row.nk - 1);
    nk = std::max(nk, row.nk);
    min_nk = std::min(min_nk, row.nk);
  }
  for (int64_t d = 0; d < hd * FD_W; ++d) ot[d] = 0.0f;
  LaneState st{qt, ot, vload(lim), min_nk, vset1(-INFINITY), vzero()};
  for (int64_t kk = 0; kk < nk;) {
    const int64_t n = chunk_len(a, kk, nk);
    const float *kp, *vp;
    chunk_kv<C8>(a, key_base(a, bt, g, kk), n, kbuf, vbuf, kp, vp);
    lane_chunk(st, kp, vp, hd, kk, n);
    kk += n;
  }
  vstore(lim, st.l);
  for (int64_t r = 0; r < nrows; ++r) {
    float* op = a.out + (rows[r].token * a.num_heads + rows[r].head) * hd;
    for (int64_t d = 0; d < hd; ++d) op[d] = ot[d * FD_W + r] / lim[r];
  }
}

template <bool C8>
static void paged_attention_impl(const AttnArgs& a) {
  struct Item {
    int64_t b, g, r0, r1;  // rows r0..r1 of (sequence b, KV head g); row r = query r / group, head r % group
  };
  const int64_t group = a.num_heads / a.num_kv_heads;
  std::vector<Item> items;
  for (int64_t b = 0; b < a.num_seqs; ++b) {
    const int64_t nrows = (a.query_start_loc[b + 1] - a.query_start_loc[b]) * group;
    const int64_t tile = nrows >= kMinLaneRows ? FD_W : kDecodeRows;
    for (int64_t g = 0; g < a.num_kv_heads; ++g)
      for (int64_t r0 = 0; r0 < nrows; r0 += tile) items.push_back({b, g, r0, std::min(nrows, r0 + tile)});
  }
  const int64_t nitems = (int64_t)items.size();
  // Dynamic scheduling evens out the causal triangle, where late queries see more keys. It is done by
  // hand with an atomic counter: GCC's schedule(dynamic) calls GOMP_loop_nonmonotonic_*, which Paddle's
  // libiomp5 lacks, so the symbol would bind to libgomp and each thread would run every item.
  std::atomic<int64_t> next{0};
#pragma omp parallel if (nitems > 1)
  for (int64_t it; (it = next.fetch_add(1, std::memory_order_relaxed)) < nitems;) {
    const Item& w = items[it];
    const int64_t qs = a.query_start_loc[w.b];
    const int64_t nq = a.query_start_loc[w.b + 1] - qs;
    const int64_t* bt = a.block_tables + w.b * a.max_blocks;
    AttnRow rows[kDecodeRows > FD_W ? kDecodeRows : FD_W];
    for (int64_t r = w.r0; r < w.r1; ++r) {
      const int64_t i = r / group;
      rows[r - w.r0] = {qs + i, w.g * group + r % group, a.seq_lens[w.b] - nq + i + 1};
    }
    const int64_t n = w.r1 - w.r0;
    if (FD_W > 1 && n >= kMinLaneRows) {
      attend_lanes<C8>(a, bt, w.g, rows, n);
    } else {
      attend_rows<C8>(a, bt, w.g, rows, n);
    }
  }
}

static void paged_attention(const AttnArgs& a) {
  if (a.k_scales) {
    paged_attention_impl<true>(a);
  } else {
    paged_attention_impl<false>(a);
  }
}
