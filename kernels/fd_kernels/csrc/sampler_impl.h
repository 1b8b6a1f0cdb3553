// Fused sampler over a batch of logits: one row per OpenMP iteration, SIMD over the vocabulary. Included
// by sampler.cc once per ISA namespace with FD_W defined. No include guard on purpose.
//
// Per row: the logits are copied into per-thread scratch (padded with -inf to whole blocks, so no pass
// has a tail); penalties and bans are applied sparsely; greedy rows return the first argmax (read in place,
// with no copy, when no penalty or ban applies). Otherwise
// x = logits / temperature and e = exp(x - max x). The kept set is a threshold on x (top-k; ties at the
// k-th value kept) and on e (top-p: the most likely tokens in (e desc, index asc) order up to the first
// whose running mass reaches (top_p - kTopPSlack) * total; min-p: e >= min_p, as max e = 1). Both
// thresholds come from binary searches over the float bit patterns, each step one vectorized count or
// masked-sum pass: about 32 passes per threshold and no sort. The draw walks the kept mass in token order
// (block sums first) to the first token whose running sum exceeds u * total.
//
// Rejection: draw from the whole temperature distribution, then test membership of the drawn token (a
// count of larger x for top-k, the mass before it for top-p: one pass each); after num_uniforms - 1
// rejections the exact path draws with the last uniform. Accepting q(t) restricted to the kept set and
// falling back to the exact draw gives exactly the exact path's distribution; membership uses the same
// sums as the exact path's thresholds, so both agree on the kept set bit for bit.

#include "simd.h"
#include "vexp.h"

constexpr int64_t kBlock = 256;      // floats per block sum of the draw; scratch rows are padded to it
constexpr double kTopPSlack = 1e-6;  // = reference.sampler.TOP_P_SLACK: mass within it counts as reached

#if FD_W == 16
static inline vf vdiv(vf a, vf b) { return _mm512_div_ps(a, b); }
static inline vf vkeep_ge(vf x, vf t, vf a) {  // a where x >= t, else 0
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, t, _CMP_GE_OQ), a);
}
static inline int vcount_ge(vf x, vf t) { return __builtin_popcount(_mm512_cmp_ps_mask(x, t, _CMP_GE_OQ)); }
#elif FD_W == 8
static inline vf vdiv(vf a, vf b) { return _mm256_div_ps(a, b); }
static inline vf vkeep_ge(vf x, vf t, vf a) { return _mm256_and_ps(_mm256_cmp_ps(x, t, _CMP_GE_OQ), a); }
static inline int vcount_ge(vf x, vf t) {
  return __builtin_popcount(_mm256_movemask_ps(_mm256_cmp_ps(x, t, _CMP_GE_OQ)));
}
#else
static inline vf vdiv(vf a, vf b) { return a / b; }
static inline vf vkeep_ge(vf x, vf t, vf a) { return x >= t ? a : 0.0f; }
static inline int vcount_ge(vf x, vf t) { return x >= t; }
#endif

// Order-preserving map between floats and int32 keys (for non-NaN values), so a threshold can be
// binary-searched over keys: key(a) < key(b) iff a < b, except -0 < +0.
static inline int32_t fkey(float f) {
  int32_t b;
  std::memcpy(&b, &f, 4);
  return b >= 0 ? b : b ^ 0x7FFFFFFF;
}
static inline float kfloat(int32_t k) {
  const int32_t b = k >= 0 ? k : k ^ 0x7FFFFFFF;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// The largest key in [lo, hi] where pred holds; pred(lo) must hold and pred must be monotone.
template <class Pred>
static int32_t last_true(int32_t lo, int32_t hi, Pred pred) {
  while (lo < hi) {
    const int32_t mid = (int32_t)(lo + ((int64_t)hi - lo + 1) / 2);
    if (pred(mid))
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// Sum of val[i] over key[i] >= t. Fixed order (4 lane accumulators), so the result is monotone in t and
// the same whoever asks: the exact and rejection paths compare identical sums.
static float sum_masked(const float* key, float t, const float* val, int64_t n) {
  const vf tv = vset1(t);
  vf a0 = vzero(), a1 = vzero(), a2 = vzero(), a3 = vzero();
  for (int64_t i = 0; i < n; i += 4 * FD_W) {
    a0 = vadd(a0, vkeep_ge(vload(key + i), tv, vload(val + i)));
    a1 = vadd(a1, vkeep_ge(vload(key + i + FD_W), tv, vload(val + i + FD_W)));
    a2 = vadd(a2, vkeep_ge(vload(key + i + 2 * FD_W), tv, vload(val + i + 2 * FD_W)));
    a3 = vadd(a3, vkeep_ge(vload(key + i + 3 * FD_W), tv, vload(val + i + 3 * FD_W)));
  }
  return vhsum(vadd(vadd(a0, a1), vadd(a2, a3)));
}

static int64_t count_ge(const float* x, float t, int64_t n) {
  const vf tv = vset1(t);
  int64_t c = 0;
  for (int64_t i = 0; i < n; i += FD_W) c += vcount_ge(vload(x + i), tv);
  return c;
}

// The next float above f (f finite; -0 counts as +0): count_ge(x, next_up(f)) counts x > f.
static inline float next_up(float f) { return kfloat(fkey(f == 0.0f ? 0.0f : f) + 1); }

// First index of the maximum (numpy's argmax); 0 when every value is -inf.
static int64_t argmax(const float* x, int64_t n) {
  vf mv = vset1(-INFINITY);
  for (int64_t i = 0; i < n; i += FD_W) mv = vmax(mv, vload(x + i));
  const float m = vhmax(mv);
  const vf tv = vset1(m);
  for (int64_t i = 0; i < n; i += FD_W) {
    if (vcount_ge(vload(x + i), tv))
      for (int64_t j = i; j < i + FD_W; ++j)
        if (x[j] >= m) return j;
  }
  return 0;
}

// argmax over a row of v logits padded to n with -inf, read where it lies instead of from a padded copy:
// the same vectors in the same order as argmax(padded, n), so the same index for every input (NaN included).
static int64_t argmax_unpadded(const float* x, int64_t v, int64_t n) {
  const int64_t body = v / FD_W * FD_W;
  alignas(64) float tail[FD_W];
  for (int64_t j = 0; j < FD_W; ++j) tail[j] = body + j < v ? x[body + j] : -INFINITY;
  auto at = [&](int64_t i) { return i < body ? vload(x + i) : i == body ? vload(tail) : vset1(-INFINITY); };
  vf mv = vset1(-INFINITY);
  for (int64_t i = 0; i < n; i += FD_W) mv = vmax(mv, at(i));
  const float m = vhmax(mv);
  const vf tv = vset1(m);
  for (int64_t i = 0; i < n; i += FD_W) {
    if (vcount_ge(at(i), tv))
      for (int64_t j = i; j < i + FD_W; ++j)
        if ((j < v ? x[j] : -INFINITY) >= m) return j;
  }
  return 0;
}

// x /= temperature (a float32 division, as numpy's row / np.float32(t)); returns the new maximum.
static float scale(float* x, int64_t n, float temperature) {
  const vf tv = vset1(temperature);
  vf mv = vset1(-INFINITY);
  for (int64_t i = 0; i < n; i += FD_W) {
    const vf v = vdiv(vload(x + i), tv);
    vstore(x + i, v);
    mv = vmax(mv, v);
  }
  return vhmax(mv);
}

// e[i] = exp(x[i] - m) where x[i] >= lo, else exactly 0 (lo > -inf drops banned tokens and padding);
// bsum[b] = block b's sum.
static void exp_pass(const float* x, float* e, float* bsum, int64_t n, float m, float lo) {
  const vf mv = vset1(m), lv = vset1(lo);
  for (int64_t b = 0; b < n / kBlock; ++b) {
    vf acc = vzero();
    for (int64_t i = b * kBlock; i < (b + 1) * kBlock; i += FD_W) {
      const vf xv = vload(x + i);
      const vf ev = vkeep_ge(xv, lv, vexp(vsub(xv, mv)));
      vstore(e + i, ev);
      acc = vadd(acc, ev);
    }
    bsum[b] = vhsum(acc);
  }
}

// Zero e below `lower`; refresh the block sums.
static void keep_pass(float* e, float* bsum, int64_t n, float lower) {
  const vf lv = vset1(lower);
  for (int64_t b = 0; b < n / kBlock; ++b) {
    vf acc = vzero();
    for (int64_t i = b * kBlock; i < (b + 1) * kBlock; i += FD_W) {
      const vf v = vload(e + i);
      const vf kept = vkeep_ge(v, lv, v);
      vstore(e + i, kept);
      acc = vadd(acc, kept);
    }
    bsum[b] = vhsum(acc);
  }
}

// The first token whose running mass exceeds u * total (numpy's searchsorted(cumsum, u * total, "right")).
// Rounding can leave the walk short of the target: then the block's (or the row's) last kept token.
static int64_t draw(const float* e, const float* bsum, int64_t n, double u) {
  const int64_t nb = n / kBlock;
  double total = 0.0;
  for (int64_t b = 0; b < nb; ++b) total += bsum[b];
  const double target = u * total;
  double acc = 0.0;
  int64_t b = 0, last = nb - 1;
  while (last > 0 && bsum[last] <= 0.0f) --last;
  for (; b < last && acc + bsum[b] <= target; ++b) acc += bsum[b];
  int64_t pick = -1;
  for (int64_t i = b * kBlock; i < (b + 1) * kBlock; ++i) {
    if (e[i] <= 0.0f) continue;
    pick = i;
    acc += e[i];
    if (acc > target) break;
  }
  return pick < 0 ? 0 : pick;
}

// The k-th largest x (0 < k < number of tokens): the largest threshold with at least k values >= it.
static float kth_largest(const float* x, int64_t n, int64_t k, float m) {
  return kfloat(last_true(fkey(-INFINITY), fkey(m), [&](int32_t key) { return count_ge(x, kfloat(key), n) >= k; }));
}

struct RowPlan {
  int64_t top_k;  // active when 0 < top_k < vocab
  double top_p, min_p;
  float lo_x;  // x below it is dropped: the k-th largest x, or the lowest finite float
};

static RowPlan plan_row(const double* p, const float* x, int64_t n, int64_t vocab, float m, bool find_kth) {
  RowPlan r{(int64_t)p[kTopK], p[kTopP], p[kMinP], -FLT_MAX};
  if (r.top_k <= 0 || r.top_k >= vocab) r.top_k = 0;
  if (r.top_k && find_kth) r.lo_x = std::max(kth_largest(x, n, r.top_k, m), -FLT_MAX);
  return r;
}

static float top_p_target(const RowPlan& r, float total) { return (float)((r.top_p - kTopPSlack) * total); }

// Exact path: the kept set by thresholds, then one draw with u.
static int64_t sample_exact(const float* x, float* e, float* bsum, int64_t n, float m, const RowPlan& r,
                            double u) {
  exp_pass(x, e, bsum, n, m, r.lo_x);
  float lower = r.min_p > 0.0 ? (float)r.min_p : 0.0f;
  if (r.top_p < 1.0) {
    const float target = top_p_target(r, sum_masked(e, 0.0f, e, n));
    // t = the largest e whose mass of e' >= t reaches the target: tokens above t are all kept, ties at t
    // in index order while the running mass is short of the target. Below min-p nothing matters: when
    // the min-p set already reaches the target, t >= min_p; otherwise min-p alone decides.
    if (sum_masked(e, lower, e, n) >= target) {
      const int32_t one = fkey(1.0f);  // e of the top token
      const int32_t key =
          last_true(fkey(lower), one, [&](int32_t k) { return sum_masked(e, kfloat(k), e, n) >= target; });
      const float t = kfloat(key);
      const float above = key < one ? sum_masked(e, next_up(t), e, n) : 0.0f;
      const int64_t ties = count_ge(e, t, n) - (key < one ? count_ge(e, next_up(t), n) : 0);
      const double need = std::ceil(((double)target - above) / t);  // >= 1: above < target
      if (need < (double)ties) {
        const int64_t keep = std::max<int64_t>(1, (int64_t)need);
        int64_t seen = 0;
        for (int64_t i = 0; i < n; ++i)
          if (e[i] == t && ++seen > keep) e[i] = 0.0f;
      }
      lower = t;
    }
  }
  if (lower > 0.0f) keep_pass(e, bsum, n, lower);
  return draw(e, bsum, n, u);
}

// Rejection path: up to `tries` draws from the whole temperature distribution, each accepted if the
// exact path would keep the token; -1 if all were rejected.
static int64_t sample_rejection(const float* x, float* e, float* bsum, int64_t n, float m, RowPlan r,
                                const double* u, int64_t tries) {
  exp_pass(x, e, bsum, n, m, -FLT_MAX);
  float target = -1.0f;  // top-p target over the top-k tokens, computed on first need
  for (int64_t i = 0; i < tries; ++i) {
    const int64_t t = draw(e, bsum, n, u[i]);
    const float et = e[t];
    if (r.min_p > 0.0 && et < (float)r.min_p) continue;
    if (r.top_k && count_ge(x, next_up(x[t]), n) >= r.top_k) continue;  // k tokens above t
    if (r.top_p < 1.0) {
      if (target < 0.0f) {
        if (r.top_k) r.lo_x = std::max(kth_largest(x, n, r.top_k, m), -FLT_MAX);
        target = top_p_target(r, sum_masked(x, r.lo_x, e, n));  // = the exact path's total, bit for bit
      }
      const float above = sum_masked(e, next_up(et), e, n);  // all inside the top-k: x > x_t
      int64_t before = 0;                                      // ties of t earlier in the row
      for (int64_t j = 0; j < t; ++j) before += (e[j] == et) & (x[j] >= r.lo_x);
      if ((double)above + (double)before * et >= (double)target) continue;
    }
    return t;
  }
  return -1;
}

struct Scratch {
  std::vector<float> x, e, bsum;
  std::vector<int32_t> count;  // output occurrences per token; all zero between rows
  std::vector<uint8_t> seen;   // token already given the repetition penalty; all zero between rows
};

// Per-thread scratch, grown on demand and kept (OpenMP's threads persist across calls).
static Scratch& scratch(int64_t vocab, int64_t padded) {
  thread_local Scratch s;
  if ((int64_t)s.x.size() < padded) {
    s.x.resize(padded);
    s.e.resize(padded);
    s.bsum.resize(padded / kBlock);
  }
  if ((int64_t)s.count.size() < vocab) {
    s.count.assign(vocab, 0);
    s.seen.assign(vocab, 0);
  }
  return s;
}

// Repetition (prompt and output, once per distinct token, in float32 like numpy), then presence and
// frequency (output; count * frequency + presence subtracted in float64, like numpy), then bans (-inf).
static void apply_penalties(const SampleArgs& a, int64_t row, float* x, Scratch& s) {
  const double* p = a.params + row * kNumSampleParams;
  const int64_t* meta = a.meta + row * kNumSampleMeta;
  const int64_t* ids = a.ids + meta[kOffset];
  const int64_t np = meta[kNumPrompt], no = meta[kNumOutput], nb = meta[kNumBanned];
  const int64_t v = a.vocab;
  if (p[kRepetitionPenalty] != 1.0) {
    const float rp = (float)p[kRepetitionPenalty];
    for (int64_t i = 0; i < np + no; ++i) {
      const int64_t t = ids[i];
      if (t < 0 || t >= v || s.seen[t]) continue;
      s.seen[t] = 1;
      x[t] = x[t] > 0.0f ? x[t] / rp : x[t] * rp;
    }
    for (int64_t i = 0; i < np + no; ++i)
      if (ids[i] >= 0 && ids[i] < v) s.seen[ids[i]] = 0;
  }
  if ((p[kPresencePenalty] != 0.0 || p[kFrequencyPenalty] != 0.0) && no > 0) {
    const int64_t* out = ids + np;
    for (int64_t i = 0; i < no; ++i)
      if (out[i] >= 0 && out[i] < v) ++s.count[out[i]];
    for (int64_t i = 0; i < no; ++i) {
      const int64_t t = out[i];
      if (t < 0 || t >= v || s.count[t] == 0) continue;
      x[t] = (float)((double)x[t] - (p[kFrequencyPenalty] * s.count[t] + p[kPresencePenalty]));
      s.count[t] = 0;
    }
  }
  for (int64_t i = np + no; i < np + no + nb; ++i)
    if (ids[i] >= 0 && ids[i] < v) x[ids[i]] = -INFINITY;
}

static int64_t sample_row(const SampleArgs& a, int64_t row) {
  const int64_t v = a.vocab, n = (v + kBlock - 1) / kBlock * kBlock;
  const double* p = a.params + row * kNumSampleParams;
  const int64_t* meta = a.meta + row * kNumSampleMeta;
  const bool greedy = p[kTemperature] < 1e-5 || p[kTopK] == 1.0;  // SamplingParams.is_greedy
  // A greedy row without penalty or ban ids leaves its logits as they are: argmax them in place (decode's
  // usual row, which then reads its logits once and copies nothing).
  if (greedy && meta[kNumPrompt] + meta[kNumOutput] + meta[kNumBanned] == 0)
    return argmax_unpadded(a.logits + row * v, v, n);
  Scratch& s = scratch(v, n);
  float *x = s.x.data(), *e = s.e.data(), *bsum = s.bsum.data();
  std::memcpy(x, a.logits + row * v, v * sizeof(float));
  std::fill(x + v, x + n, -INFINITY);
  apply_penalties(a, row, x, s);
  if (greedy) return argmax(x, n);
  const float m = scale(x, n, (float)p[kTemperature]);
  if (m == -INFINITY) return 0;  // every token banned: nothing to draw from
  const double* u = a.uniforms + row * a.num_uniforms;
  if (a.rejection && a.num_uniforms > 1) {
    const int64_t t = sample_rejection(x, e, bsum, n, m, plan_row(p, x, n, v, m, false), u, a.num_uniforms - 1);
    if (t >= 0) return t;
  }
  return sample_exact(x, e, bsum, n, m, plan_row(p, x, n, v, m, true), u[a.num_uniforms - 1]);
}

static void sample(const SampleArgs& a) {
#pragma omp parallel for schedule(static) if (a.rows > 1)
  for (int64_t r = 0; r < a.rows; ++r) a.out[r] = sample_row(a, r);
}
