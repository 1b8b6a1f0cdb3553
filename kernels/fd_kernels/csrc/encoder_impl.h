// ISA-generic encoder kernels (interface: encoder_kernels.h). encoder_kernels.cc includes this file once
// per ISA namespace with FD_W defined, as kernels.cc does with kern_impl.h. No include guard on purpose.

#include "simd.h"

// ------------------------------------------------------------------------------------ vector math
#include "vexp.h"  // vexp, shared with kern_impl.h and sampler_impl.h

// 1 / x from the hardware estimate and one Newton step (relative error ~1e-7): a full-width divide has a
// throughput of one per 5-10 cycles and bounded GELU.
#if FD_W == 16
static inline vf vrcp(vf x) {
  const vf r = _mm512_rcp14_ps(x);
  return vmul(r, vfma(vsub(vzero(), x), r, vset1(2.0f)));
}
#elif FD_W == 8
static inline vf vrcp(vf x) {
  const vf r = _mm256_rcp_ps(x);
  return vmul(r, vfma(vsub(vzero(), x), r, vset1(2.0f)));
}
#else
static inline vf vrcp(vf x) { return 1.0f / x; }
#endif

#if FD_W == 16
static inline vf vabs(vf x) { return _mm512_abs_ps(x); }
static inline vf vselect_neg(vf x, vf if_neg, vf if_not) {  // lane-wise x < 0 ? if_neg : if_not
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, vzero(), _CMP_LT_OQ), if_not, if_neg);
}
#elif FD_W == 8
static inline vf vabs(vf x) { return _mm256_andnot_ps(vset1(-0.0f), x); }
static inline vf vselect_neg(vf x, vf if_neg, vf if_not) {
  return _mm256_blendv_ps(if_not, if_neg, _mm256_cmp_ps(x, vzero(), _CMP_LT_OQ));
}
#else
static inline vf vabs(vf x) { return std::fabs(x); }
static inline vf vselect_neg(vf x, vf if_neg, vf if_not) { return x < 0.0f ? if_neg : if_not; }
#endif

// x * Phi(x). erfc(z) for z = |x| / sqrt 2 by Abramowitz & Stegun 7.1.26 (absolute error <= 1.5e-7):
// erfc(z) = t (a1 + t (a2 + ...)) exp(-z^2), t = 1 / (1 + p z); then Phi(x) = erfc(z) / 2 for x < 0 and
// 1 - erfc(z) / 2 otherwise, so no 1 - erf cancellation happens on the negative side.
static inline vf vgelu(vf x) {
  // z capped at 10 (erfc(10) ~ 2e-45 is 0 in fp32) so that x = +-inf leaves no inf * 0 in the reciprocal;
  // gelu(-inf) is then -inf * 0 = nan, as Paddle's.
  const vf z = vsub(vzero(), vmax(vmul(vabs(x), vset1(-0.70710678118654752f)), vset1(-10.0f)));
  const vf t = vrcp(vfma(z, vset1(0.3275911f), vset1(1.0f)));
  vf p = vset1(1.061405429f);
  p = vfma(p, t, vset1(-1.453152027f));
  p = vfma(p, t, vset1(1.421413741f));
  p = vfma(p, t, vset1(-0.284496736f));
  p = vfma(p, t, vset1(0.254829592f));
  vf half_erfc = vmul(vmul(p, t), vmul(vexp(vsub(vzero(), vmul(z, z))), vset1(0.5f)));
  half_erfc = vselect_neg(vsub(z, vset1(10.0f)), half_erfc, vzero());  // exactly 0 at the cap, as erfc in fp32
  return vmul(x, vselect_neg(x, half_erfc, vsub(vset1(1.0f), half_erfc)));
}

static void gelu(const float* x, int64_t n, float* out) {
  constexpr int64_t kChunk = 4096;  // elements per work item: whole cache lines, even split across threads
  const int64_t nchunks = (n + kChunk - 1) / kChunk;
  // Threads only from 2^16 elements: waking the pool costs more than a short row set (batch 1).
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
  for (int64_t c = 0; c < nchunks; ++c) {
    const int64_t end = std::min(n, (c + 1) * kChunk);
    int64_t i = c * kChunk;
    for (; i + FD_W <= end; i += FD_W) vstore(out + i, vgelu(vload(x + i)));
    for (; i < end; ++i) {
      const float z = std::fabs(x[i]) * 0.70710678118654752f;
      const float half_erfc = 0.5f * std::erfc(z);
      out[i] = x[i] * (x[i] < 0.0f ? half_erfc : 1.0f - half_erfc);
    }
  }
}

// ------------------------------------------------------------------------------------ add + LayerNorm
static inline float row_sum(const float* x, int64_t h) {
  vf acc = vzero();
  int64_t i = 0;
  for (; i + FD_W <= h; i += FD_W) acc = vadd(acc, vload(x + i));
  float s = vhsum(acc);
  for (; i < h; ++i) s += x[i];
  return s;
}

// Two passes for the statistics, as Paddle's and torch's layer_norm (E[x^2] - mean^2 loses digits when
// |mean| >> std): the mean, then the squared deviations from it. The second pass also sums the deviations
// and corrects the mean by their average, which cancels the rounding of the first sum (the "corrected
// two-pass" algorithm): a sequential fp32 sum (the scalar path) is otherwise off by ~1e-7 relative.
static void add_layer_norm(const float* x, const float* res, const float* w, const float* b, float eps, int64_t t,
                           int64_t h, float* out) {
#pragma omp parallel for schedule(static) if (t * h >= (1 << 16))
  for (int64_t r = 0; r < t; ++r) {
    const float *xr = x + r * h, *rr = res + r * h;
    float* o = out + r * h;  // holds x + res until the last pass overwrites it
    int64_t i = 0;
    for (; i + FD_W <= h; i += FD_W) vstore(o + i, vadd(vload(xr + i), vload(rr + i)));
    for (; i < h; ++i) o[i] = xr[i] + rr[i];
    const float mean0 = row_sum(o, h) / (float)h;
    const vf m0 = vset1(mean0);
    vf dsum = vzero(), dsq = vzero();
    for (i = 0; i + FD_W <= h; i += FD_W) {
      const vf d = vsub(vload(o + i), m0);
      dsum = vadd(dsum, d);
      dsq = vfma(d, d, dsq);
    }
    float sd = vhsum(dsum), sq = vhsum(dsq);
    for (; i < h; ++i) {
      const float d = o[i] - mean0;
      sd += d;
      sq += d * d;
    }
    const float shift = sd / (float)h;
    const float var = std::max(sq / (float)h - shift * shift, 0.0f);
    const float mean = mean0 + shift, rstd = 1.0f / std::sqrt(var + eps);
    const vf mv = vset1(mean), rv = vset1(rstd);
    for (i = 0; i + FD_W <= h; i += FD_W)
      vstore(o + i, vfma(vmul(vsub(vload(o + i), mv), rv), vload(w + i), vload(b + i)));
    for (; i < h; ++i) o[i] = (o[i] - mean) * rstd * w[i] + b[i];
  }
}

// ------------------------------------------------------------------------------------ varlen attention
// Work item: one head of one sequence, a tile of up to FD_W consecutive queries held in vector lanes (q
// transposed to qt[hd][FD_W], pre-scaled). Every query of the tile sees the same keys (no mask), so an
// exact two-pass softmax over the whole row of scores (at most max_seqlen vectors, in L1/L2) replaces the
// online one: scores, then exp and sum, then P x V; no rescaling. Scores and P x V are FMAs with
// broadcast key/value elements, no horizontal sums.
constexpr int64_t kEncMaxHeadDim = 512;  // checked by the glue
constexpr int kEncKeys = FD_W == 8 ? 8 : 16;  // keys per score block: accumulators + 4 q vectors in registers

// sc[j * FD_W + lane] = q_lane . k_j for keys j < n (n <= N) of a block starting at kp (rows ks apart).
// Keys past n repeat key n - 1 (results ignored) so a short block still runs N independent FMA chains.
template <int N>
static inline void score_block(const float* qt, const float* kp, int64_t ks, int64_t hd, int64_t n, float* sc,
                               vf& mx) {
  const float* kr[N];
  for (int j = 0; j < N; ++j) kr[j] = kp + std::min<int64_t>(j, n - 1) * ks;
  vf acc[N];
  for (int j = 0; j < N; ++j) acc[j] = vzero();
  int64_t d = 0;
  for (; d + 4 <= hd; d += 4) {
    const vf q0 = vload(qt + d * FD_W), q1 = vload(qt + (d + 1) * FD_W);
    const vf q2 = vload(qt + (d + 2) * FD_W), q3 = vload(qt + (d + 3) * FD_W);
    for (int j = 0; j < N; ++j) {
      const float* kj = kr[j] + d;
      acc[j] = vfma(q0, vset1(kj[0]), acc[j]);
      acc[j] = vfma(q1, vset1(kj[1]), acc[j]);
      acc[j] = vfma(q2, vset1(kj[2]), acc[j]);
      acc[j] = vfma(q3, vset1(kj[3]), acc[j]);
    }
  }
  for (; d < hd; ++d) {
    const vf q0 = vload(qt + d * FD_W);
    for (int j = 0; j < N; ++j) acc[j] = vfma(q0, vset1(kr[j][d]), acc[j]);
  }
  for (int j = 0; j < N; ++j) {
    if (j >= n) break;
    vstore(sc + j * FD_W, acc[j]);
    mx = vmax(mx, acc[j]);
  }
}

// Output dims d .. d+D of every lane: sum_j p_j v_j, scaled by inv_l, scattered to the tile's rows.
template <int D>
static inline void pv_block(const float* sc, const float* vp, int64_t vs, int64_t nk, int64_t d, vf inv_l,
                            float* out, int64_t out_stride, int64_t nq) {
  vf o[D];
  for (int i = 0; i < D; ++i) o[i] = vzero();
  for (int64_t j = 0; j < nk; ++j) {
    const vf p = vload(sc + j * FD_W);
    const float* vj = vp + j * vs + d;
    for (int i = 0; i < D; ++i) o[i] = vfma(p, vset1(vj[i]), o[i]);
  }
  alignas(64) float tmp[D][FD_W];
  for (int i = 0; i < D; ++i) vstore(tmp[i], vmul(o[i], inv_l));
  for (int64_t r = 0; r < nq; ++r)
    for (int i = 0; i < D; ++i) out[r * out_stride + d + i] = tmp[i][r];
}

// Queries q0 .. q0+nq of head h of the sequence whose tokens start at s0 and number nk.
static void attend_tile(const VarlenAttnArgs& a, int64_t s0, int64_t nk, int64_t h, int64_t q0, int64_t nq,
                        float* sc) {
  const int64_t hd = a.head_dim;
  alignas(64) float qt[kEncMaxHeadDim * FD_W];
  for (int64_t r = 0; r < FD_W; ++r) {  // idle lanes repeat the last query
    const float* qp = a.q + (s0 + q0 + std::min(r, nq - 1)) * a.q_stride + h * hd;
    for (int64_t d = 0; d < hd; ++d) qt[d * FD_W + r] = qp[d] * a.scale;
  }
  const float* kp = a.k + s0 * a.k_stride + h * hd;
  vf mx = vset1(-INFINITY);
  for (int64_t j = 0; j < nk; j += kEncKeys)
    score_block<kEncKeys>(qt, kp + j * a.k_stride, a.k_stride, hd, std::min<int64_t>(kEncKeys, nk - j),
                          sc + j * FD_W, mx);
  vf l = vzero();
  for (int64_t j = 0; j < nk; ++j) {
    const vf p = vexp(vsub(vload(sc + j * FD_W), mx));
    vstore(sc + j * FD_W, p);
    l = vadd(l, p);
  }
  const vf inv_l = vset1(1.0f) / l;
  const float* vp = a.v + s0 * a.v_stride + h * hd;
  const int64_t os = a.num_heads * hd;
  float* out = a.out + (s0 + q0) * os + h * hd;
  int64_t d = 0;
  for (; d + 8 <= hd; d += 8) pv_block<8>(sc, vp, a.v_stride, nk, d, inv_l, out, os, nq);
  for (; d + 4 <= hd; d += 4) pv_block<4>(sc, vp, a.v_stride, nk, d, inv_l, out, os, nq);
  for (; d < hd; ++d) pv_block<1>(sc, vp, a.v_stride, nk, d, inv_l, out, os, nq);
}

static void varlen_attention(const VarlenAttnArgs& a) {
  struct Item {
    int64_t b, h, q0;
  };
  std::vector<Item> items;
  int64_t macs = 0;  // multiply-adds of the scores (as many again for P x V)
  for (int64_t b = 0; b < a.num_seqs; ++b) {
    const int64_t n = a.cu_seqlens[b + 1] - a.cu_seqlens[b];
    macs += n * n * a.num_heads * a.head_dim;
    for (int64_t h = 0; h < a.num_heads; ++h)
      for (int64_t q0 = 0; q0 < n; q0 += FD_W) items.push_back({b, h, q0});
  }
  const int64_t nitems = (int64_t)items.size();
  // Hand-rolled dynamic schedule (sequences differ in length): schedule(dynamic) would bind GOMP entry
  // points that Paddle's libiomp5 lacks (see paged_attention in attn_impl.h).
  std::atomic<int64_t> next{0};
  // One thread below ~1M multiply-adds (one 30-token sentence of MiniLM is 0.35M): waking the pool
  // would cost as much as the work.
#pragma omp parallel if (nitems > 1 && macs >= (1 << 20))
  {
    std::vector<float> sc(std::max<int64_t>(a.max_seqlen, 1) * FD_W);  // a tile's scores: one vector per key
    for (int64_t it; (it = next.fetch_add(1, std::memory_order_relaxed)) < nitems;) {
      const Item& w = items[it];
      const int64_t s0 = a.cu_seqlens[w.b], n = a.cu_seqlens[w.b + 1] - s0;
      attend_tile(a, s0, n, w.h, w.q0, std::min<int64_t>(FD_W, n - w.q0), sc.data());
    }
  }
}
